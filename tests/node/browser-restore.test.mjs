// A restore tells everyone (issue 41, item 2): Ben has typed into main.py when Ana restores a
// checkpoint from before; his page tells him who restored what and that what was there is
// kept, and one click on Undo brings his work back, for everyone.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { api, mintToken, skipUnless, joinByInvite, openProvider, waitSynced, destroyAll, waitFor, serverFiles, Y } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shotsAll, editorText } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('a restore tells everyone who restored what, and one click undoes it', { skip, timeout: 240_000 }, async (t) => {
  const s = await scene(t, ['ana@example.com', 'ben@example.com'])
  const { storage, server, people: [ana, ben] } = s
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'restores')
  const anaToken = await mintToken(storage, 'ana@example.com')
  const c = openProvider(server, roomId, anaToken)
  s.defer(() => destroyAll([c]))
  await waitSynced(c.provider)
  c.doc.getMap('files').set('main.py', new Y.Text('print("v1")\n'))
  await waitFor(async () => (await serverFiles(server, roomId, anaToken))['main.py'] === 'print("v1")\n', 10_000, 'main.py never reached the room')
  const cp = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/checkpoints`, { name: 'start' })
  assert.equal(cp.status, 201, JSON.stringify(cp.body))

  // Ben, an editor, types his work into main.py.
  await joinByInvite(server, storage, roomId, anaToken, 'ben@example.com', 'editor')
  await login(ben, storage.dataDir, `/rooms/${roomId}`)
  await ben.page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()
  await ben.page.locator('button.file[data-path="main.py"]').click()
  await waitFor(async () => (await editorText(ben.page)).startsWith('print("v1")'), 10_000, 'main.py did not open')
  await ben.page.locator('.cm-content').click()
  await ben.page.keyboard.press('Control+End')
  await ben.page.keyboard.type('print("ben\'s work")')
  const withBen = 'print("v1")\nprint("ben\'s work")'
  await waitFor(() => c.doc.getMap('files').get('main.py')?.toString() === withBen, 10_000, 'Ben\'s typing never reached the room')

  // Ana restores the checkpoint from before.
  const restored = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/checkpoints/${cp.body.id}/restore`)
  assert.equal(restored.status, 200, JSON.stringify(restored.body))
  assert.ok(restored.body.undo, JSON.stringify(restored.body))

  // Both are told; Ben's editor shows the checkpoint's file.
  const told = ben.page.getByTestId('restored')
  await told.filter({ hasText: 'ana@example.com restored the checkpoint "start"' }).waitFor({ timeout: 30_000 })
  await ana.page.getByTestId('restored').filter({ hasText: 'You restored the checkpoint "start"' }).waitFor({ timeout: 30_000 })
  await waitFor(async () => (await editorText(ben.page)) === 'print("v1")\n', 10_000,
    async () => `Ben's editor shows ${JSON.stringify(await editorText(ben.page))}`)
  await shotsAll(ben.page, '61-restore-told')

  // One click: his work is back, for everyone.
  await ben.page.getByTestId('restored-act').click()
  await waitFor(async () => (await editorText(ben.page)) === withBen, 30_000,
    async () => `after the undo Ben's editor shows ${JSON.stringify(await editorText(ben.page))}`)
  await waitFor(() => c.doc.getMap('files').get('main.py')?.toString() === withBen, 10_000, 'the undo never reached the room')
  // The checkpoints kept both states, named for what they were.
  const list = (await api(server, anaToken, 'GET', `/api/rooms/${roomId}/checkpoints`)).body
  const names = (Array.isArray(list) ? list : list.checkpoints).map((x) => x.name)
  assert.ok(names.includes('before restoring "start"'), JSON.stringify(names))
  assert.deepEqual(ana.errors, [])
  assert.deepEqual(ben.errors, [])
})
