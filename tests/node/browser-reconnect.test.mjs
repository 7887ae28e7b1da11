// The browser room through a server restart: the page says it is offline and how many local
// edits wait, keeps them, and sends them once the server is back; the terminal reconnects.
// Also: files created from the keyboard, renamed and deleted from the tree.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { cleanups, createStorage, mintToken, startServer, openProvider, waitSynced, waitFor, destroyAll, freePort } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, launch, person, login, shot, editorText, terminalText } from './lib/browser.mjs'

const skip = HAVE_CHROMIUM ? false : `SKIPPED: no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`

async function serverFiles (server, roomId, token) {
  const c = openProvider(server, roomId, token)
  try {
    await waitSynced(c.provider)
    return Object.fromEntries(Array.from(c.doc.getMap('files').entries()).map(([k, v]) => [k, v.toString()]))
  } finally {
    destroyAll([c])
  }
}

test('offline edits are kept, shown as pending, and land after a server restart; files are created, renamed and deleted',
  { skip, timeout: 240_000 }, async (t) => {
    const defer = cleanups(t)
    const storage = await createStorage('sqlite')
    defer(() => storage.cleanup())
    const listen = `127.0.0.1:${await freePort()}`
    let server = await startServer(storage, { listen })
    defer(() => server.kill())
    const browser = await launch()
    defer(() => browser.close())
    const ana = await person(browser, server, 'ana@example.com')
    const { page } = ana
    const dialogs = []
    page.on('dialog', (d) => { dialogs.push(d.message()); void d.dismiss() })

    await login(ana, storage.dataDir)
    // Names are text, never markup.
    const hostile = '<img src=x onerror=alert(1)>'
    await page.getByLabel('Room name').fill(hostile)
    await page.getByRole('button', { name: 'Create room' }).click()
    await page.waitForURL(/\/rooms\/[A-Za-z0-9_-]+$/)
    const roomId = page.url().split('/').pop()
    const token = await mintToken(storage, 'ana@example.com')
    const status = page.getByTestId('conn-status')
    await status.filter({ hasText: 'Synced' }).waitFor()
    await page.locator('#room-title .name').filter({ hasText: hostile }).waitFor()

    // Keyboard first: Alt+N opens the new-file field.
    await page.keyboard.press('Alt+N')
    await page.getByTestId('file-path').fill('a.txt')
    await page.getByTestId('file-path').press('Enter')
    await page.locator('.cm-content').click()
    await page.keyboard.type('one', { delay: 5 })
    await waitFor(async () => (await serverFiles(server, roomId, token))['a.txt'] === 'one', 10_000, 'the first edit did not reach the server')
    // A bad name gets a reason, not a file.
    await page.keyboard.press('Alt+N')
    await page.getByTestId('file-path').fill('../escape')
    await page.getByTestId('file-path').press('Enter')
    await page.getByText('Empty, . and .. path parts are not allowed').waitFor()
    await page.getByTestId('file-path').press('Escape')
    await page.keyboard.press('Alt+N')
    await page.getByTestId('file-path').fill(`${hostile}.txt`)
    await page.getByTestId('file-path').press('Enter')
    await page.locator('button.file', { hasText: `${hostile}.txt` }).waitFor()
    assert.equal(await page.locator('img[src=x]').count(), 0, 'a name became markup')
    await page.getByRole('button', { name: `Delete ${hostile}.txt` }).click()
    await page.getByRole('button', { name: `Delete ${hostile}.txt` }).click()
    await page.locator('button.file[data-path="a.txt"]').click()

    // The server goes away: the page says offline, and counts what has not been sent.
    assert.deepEqual(await server.stop(), { code: 0, signal: null })
    await status.filter({ hasText: 'Offline' }).waitFor({ timeout: 15_000 })
    await page.getByTestId('terminal-status').filter({ hasText: /Disconnected|reconnecting/ }).waitFor({ timeout: 15_000 })
    await page.locator('.cm-content').click()
    await page.keyboard.press('End')
    await page.keyboard.type(' two', { delay: 5 })
    await status.filter({ hasText: /local edits? not yet sent/ }).waitFor()
    await shot(page, '13-offline-pending')

    // Back on the same address: the edits land, the terminal works again.
    server = await startServer(storage, { listen })
    await status.filter({ hasText: 'Synced' }).waitFor({ timeout: 30_000 })
    await waitFor(async () => (await serverFiles(server, roomId, token))['a.txt'] === 'one two', 15_000,
      'the offline edits did not reach the server')
    await page.getByTestId('terminal-status').filter({ hasText: 'Connected' }).waitFor({ timeout: 30_000 })
    await page.getByTestId('terminal').click()
    await page.keyboard.type('echo back-$((20+1))\n', { delay: 5 })
    await waitFor(async () => (await terminalText(page)).includes('back-21'), 20_000, 'the terminal did not come back')

    // Rename from the tree: the text moves, the old path is gone, the tab follows.
    await page.getByRole('button', { name: 'Rename a.txt' }).click()
    await page.getByTestId('file-path').fill('docs/b.txt')
    await page.getByTestId('file-path').press('Enter')
    await page.locator('button.file[data-path="docs/b.txt"]').waitFor()
    assert.equal(await editorText(page), 'one two')
    await waitFor(async () => {
      const f = await serverFiles(server, roomId, token)
      return f['docs/b.txt'] === 'one two' && !('a.txt' in f)
    }, 10_000, 'the rename did not reach the server')
    // Delete asks twice.
    await page.getByRole('button', { name: 'Delete docs/b.txt' }).click()
    await page.getByRole('button', { name: 'Delete docs/b.txt' }).click()
    await waitFor(async () => !('docs/b.txt' in (await serverFiles(server, roomId, token))), 10_000, 'the delete did not reach the server')
    await page.getByText('No files yet.').waitFor()

    assert.deepEqual(dialogs, [], 'no script ran from a name')
    assert.deepEqual(ana.foreign, [])
    assert.deepEqual(ana.errors, [])
    assert.deepEqual(await server.stop(), { code: 0, signal: null })
  })
