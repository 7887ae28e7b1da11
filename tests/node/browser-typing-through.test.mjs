// Nobody's typing is lost to someone else's file operation (issue 41, item 1): Ben types at 20
// keys a second while Ana renames his file, moves it to another folder and deletes it, all from
// her file tree. His editor keeps focus and cursor throughout, every key he typed is in the
// file at the end, in order, and he is told who deleted it and that it is back. A file he only
// has open, deleted under him, stays shown as deleted, and one click restores it from the
// trash. Each operation is one audit entry, in words.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { api, mintToken, skipUnless, joinByInvite, openProvider, waitSynced, destroyAll, waitFor, serverFiles, Y } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shotsAll, editorText, openPanel } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

/** What Ben types: 300 keys, letters and digits, no two runs alike (so order shows). */
const TYPED = Array.from({ length: 150 }, (_, i) => `${'abcdefghijklmnopqrstuvwxyz'[i % 26]}${i % 10}`).join('')

test('a typist keeps every key through a rename, a move and a delete by someone else', { skip, timeout: 300_000 }, async (t) => {
  const s = await scene(t, ['ana@example.com', 'ben@example.com'])
  const { storage, server, people: [ana, ben] } = s
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'typing through')
  const anaToken = await mintToken(storage, 'ana@example.com')
  const watcher = openProvider(server, roomId, anaToken)
  s.defer(() => destroyAll([watcher]))
  await waitSynced(watcher.provider)
  const files = watcher.doc.getMap('files')
  files.set('server.py', new Y.Text('x = 1\n'))
  files.set('notes.md', new Y.Text('# notes\n'))
  await waitFor(async () => (await serverFiles(server, roomId, anaToken))['notes.md'] === '# notes\n', 10_000, 'the files never reached the room')

  await joinByInvite(server, storage, roomId, anaToken, 'ben@example.com', 'editor')
  await login(ben, storage.dataDir, `/rooms/${roomId}`)
  await ben.page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()
  await ben.page.locator('button.file[data-path="server.py"]').click()
  await waitFor(async () => (await editorText(ben.page)) === 'x = 1\n', 10_000, 'server.py did not open')
  await ben.page.locator('.cm-content').click()
  await ben.page.keyboard.press('Control+End')

  // Ben types; the room's copy of his file grows as he does (wherever the file is).
  const typedSoFar = () => {
    let best = 0
    for (const [, text] of files.entries()) {
      const body = text.toString()
      if (!body.startsWith('x = 1\n')) continue
      const rest = body.slice('x = 1\n'.length)
      let n = 0
      while (n < rest.length && n < TYPED.length && rest[n] === TYPED[n]) n++
      best = Math.max(best, n)
    }
    return best
  }
  const typing = ben.page.keyboard.type(TYPED, { delay: 50 })
  const ops = (async () => {
    const tree = ana.page
    const renameTo = async (from, to) => {
      await tree.getByRole('button', { name: `Rename ${from}` }).click()
      await tree.getByTestId('file-path').fill(to)
      await tree.getByTestId('file-path').press('Enter')
      await tree.locator(`button.file[data-path="${to}"]`).waitFor()
    }
    await waitFor(() => typedSoFar() >= 40, 30_000, 'ben\'s typing never reached the room')
    await renameTo('server.py', 'app.py')
    await ben.page.locator('.tab.active .tab-name', { hasText: 'app.py' }).waitFor()
    await waitFor(() => typedSoFar() >= 120, 30_000, 'ben\'s typing stopped after the rename')
    await renameTo('app.py', 'src/app.py')
    await ben.page.locator('.tab.active .tab-name', { hasText: 'app.py' }).waitFor()
    await waitFor(() => typedSoFar() >= 200, 30_000, 'ben\'s typing stopped after the move')
    await tree.getByRole('button', { name: 'Delete src/app.py' }).click()
    await tree.getByRole('button', { name: 'Delete src/app.py' }).click()
    await waitFor(async () => (await api(server, anaToken, 'GET', `/api/rooms/${roomId}/trash`)).body.length === 1, 10_000,
      'the deletion never reached the trash')
  })()
  await Promise.all([typing, ops])

  // Every key, in order, in the file, for everyone; his editor still has focus and shows it.
  const want = `x = 1\n${TYPED}`
  await waitFor(async () => Object.values(await serverFiles(server, roomId, anaToken)).includes(want), 20_000,
    async () => `no file holds all ben typed: ${JSON.stringify(await serverFiles(server, roomId, anaToken))}`)
  const final = await serverFiles(server, roomId, anaToken)
  assert.equal(final['src/app.py'], want, JSON.stringify(final))
  assert.equal(final['server.py'], undefined)
  assert.equal(final['app.py'], undefined)
  await waitFor(async () => (await editorText(ben.page)) === want, 10_000, 'ben\'s editor does not show all he typed')
  assert.ok(await ben.page.evaluate(() => document.activeElement?.closest('.cm-editor') !== null), 'ben\'s editor lost focus')
  await ben.page.getByTestId('file-came-back').filter({ hasText: 'ana@example.com deleted src/app.py while you were' }).waitFor()
  await ana.page.locator('button.file[data-path="src/app.py"]').waitFor()

  // A file Ben only has open: deleted under him, it stays shown as deleted; one click on
  // Restore brings it back from the trash, bound again.
  await ben.page.locator('button.file[data-path="notes.md"]').click()
  await waitFor(async () => (await editorText(ben.page)) === '# notes\n', 10_000, 'notes.md did not open')
  await ana.page.getByRole('button', { name: 'Delete notes.md' }).click()
  await ana.page.getByRole('button', { name: 'Delete notes.md' }).click()
  const told = ben.page.getByTestId('file-deleted').filter({ hasText: 'ana@example.com deleted notes.md. It waits in the trash.' })
  await told.waitFor()
  await ben.page.locator('.tab.active .tab-name.deleted', { hasText: 'notes.md' }).waitFor()
  assert.equal(await editorText(ben.page), '# notes\n')
  await shotsAll(ben.page, '64-file-deleted-told')
  await ben.page.getByTestId('file-deleted-act').click()
  await ben.page.locator('.tab.active .tab-name:not(.deleted)', { hasText: 'notes.md' }).waitFor()
  await waitFor(async () => (await serverFiles(server, roomId, anaToken))['notes.md'] === '# notes\n', 10_000, 'the restore never reached the room')
  // Bound again: what he types now is the room's.
  await ben.page.locator('.cm-content').click()
  await ben.page.keyboard.press('Control+End')
  await ben.page.keyboard.type('more')
  await waitFor(async () => (await serverFiles(server, roomId, anaToken))['notes.md'] === '# notes\nmore', 10_000, 'typing after the restore was lost')

  // The trash in the file tree, and the audit log in words: each operation once, by Ana.
  await ana.page.getByTestId('trash').locator('summary').click()
  await ana.page.getByTestId('trash-list').getByText('src/app.py').waitFor()
  await shotsAll(ana.page, '65-trash')
  const audit = (await api(server, anaToken, 'GET', `/api/rooms/${roomId}/audit`)).body
  const fileOps = audit.filter((r) => r.action.endsWith('_file')).map((r) => `${r.action} ${r.details.path}${r.details.to ? ` ${r.details.to}` : ''}`)
  for (const op of ['create_file server.py', 'create_file notes.md', 'rename_file server.py app.py', 'move_file app.py src/app.py',
    'delete_file src/app.py', 'delete_file notes.md', 'restore_file notes.md']) {
    assert.equal(fileOps.filter((o) => o === op).length, 1, `${op} in ${JSON.stringify(fileOps)}`)
  }
  await openPanel(ana.page, 'Audit')
  await ana.page.getByText('ana@example.com renamed server.py to app.py.').waitFor()
  await ana.page.getByText('ana@example.com moved app.py to src/app.py.').waitFor()
  assert.deepEqual(ana.errors, [])
  assert.deepEqual(ben.errors, [])
})
