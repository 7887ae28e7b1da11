// Renames in the browser lose nobody's edits: the file tree's rename and folder rename, while a
// stock y-websocket client edits the same files offline; a rename by someone else moves the
// page's open tab; and a rename built without the page's latest typing keeps that typing.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mintToken, serverFiles, waitFor, skipUnless, openProvider, waitSynced, destroyAll, Y } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot, editorText } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

function rename (doc, from, to) {
  const files = doc.getMap('files')
  doc.transact(() => {
    files.set(to, new Y.Text(files.get(from).toString()))
    files.delete(from)
  })
}

test('renames from the file tree keep an offline collaborator\'s edits; tabs follow renames',
  { skip, timeout: 180_000 }, async (t) => {
    const s = await scene(t, ['ana@example.com'])
    const { storage, server, people: [ana] } = s
    const { page } = ana
    await login(ana, storage.dataDir)
    const roomId = await createRoomFromPage(ana, 'renames')
    const token = await mintToken(storage, 'ana@example.com')
    const files = async () => serverFiles(server, roomId, token)
    const same = (a, b) => JSON.stringify(a) === JSON.stringify(b)

    // Ben works from a stock y-websocket client.
    const ben = openProvider(server, roomId, token)
    s.defer(() => destroyAll([ben]))
    await waitSynced(ben.provider)
    const benFiles = ben.doc.getMap('files')
    benFiles.set('a.txt', new Y.Text('hello world'))
    benFiles.set('src/x.txt', new Y.Text('x1'))
    benFiles.set('src/y.txt', new Y.Text('y1'))
    await page.locator('button.file[data-path="src/y.txt"]').waitFor()
    await page.locator('button.file[data-path="a.txt"]').click()
    await waitFor(async () => (await editorText(page)) === 'hello world', 10_000, 'a.txt did not open')

    // Ben goes offline and edits all three files.
    ben.provider.disconnect()
    benFiles.get('a.txt').insert(5, ', dear')
    benFiles.get('src/x.txt').insert(2, '!')
    benFiles.get('src/y.txt').insert(2, '?')

    // Ana renames the open file and the folder from the tree.
    await page.getByRole('button', { name: 'Rename a.txt' }).click()
    await page.getByTestId('file-path').fill('b.txt')
    await page.getByTestId('file-path').press('Enter')
    await page.locator('button.file[data-path="b.txt"]').waitFor()
    await page.getByRole('button', { name: 'Rename folder src' }).click()
    await page.getByTestId('file-path').fill('b.txt')
    await page.getByTestId('file-path').press('Enter')
    await page.getByText('b.txt is a file').waitFor()
    await page.getByTestId('file-path').fill('lib')
    await page.getByTestId('file-path').press('Enter')
    await page.locator('button.file[data-path="lib/y.txt"]').waitFor()
    await waitFor(async () => same(await files(), { 'b.txt': 'hello world', 'lib/x.txt': 'x1', 'lib/y.txt': 'y1' }),
      10_000, 'the renames did not reach the server')

    // Ben comes back: every character he typed is in the renamed files, everywhere.
    ben.provider.connect()
    const want = { 'b.txt': 'hello, dear world', 'lib/x.txt': 'x1!', 'lib/y.txt': 'y1?' }
    await waitFor(async () => same(await files(), want), 15_000, 'the offline edits did not land in the renamed files')
    await waitFor(() => same(Object.fromEntries([...benFiles.entries()].map(([k, v]) => [k, v.toString()]).sort()), want),
      15_000, 'ben\'s client did not converge')
    await waitFor(async () => (await editorText(page)) === 'hello, dear world', 10_000, 'the page did not show ben\'s edit')
    await page.locator('button.file[data-path="lib/x.txt"]').click()
    await waitFor(async () => (await editorText(page)) === 'x1!', 10_000, 'lib/x.txt does not show ben\'s edit')
    await page.locator('button.file[data-path="b.txt"]').click()
    await waitFor(async () => (await editorText(page)) === 'hello, dear world', 10_000, 'b.txt did not open')

    // Someone else renames the open file: the tab follows.
    rename(ben.doc, 'b.txt', 'c.txt')
    await page.locator('.tab.active .tab-name', { hasText: 'c.txt' }).waitFor()
    assert.equal(await editorText(page), 'hello, dear world')

    // A rename built without what Ana types meanwhile (Ben offline again) keeps her typing.
    ben.provider.disconnect()
    rename(ben.doc, 'c.txt', 'd.txt')
    await page.locator('.cm-content').click()
    await page.keyboard.press('Control+End')
    await page.keyboard.type(' again', { delay: 5 })
    await waitFor(async () => (await files())['c.txt'] === 'hello, dear world again', 10_000, 'ana\'s typing did not land')
    ben.provider.connect()
    await page.locator('.tab.active .tab-name', { hasText: 'd.txt' }).waitFor()
    const end = { 'd.txt': 'hello, dear world again', 'lib/x.txt': 'x1!', 'lib/y.txt': 'y1?' }
    await waitFor(async () => same(await files(), end), 15_000, 'the rename lost ana\'s typing')
    await waitFor(async () => (await editorText(page)) === 'hello, dear world again', 10_000, 'the page lost ana\'s typing')
    await shot(page, '17-renamed-with-edits')
    assert.deepEqual(ana.foreign, [])
    assert.deepEqual(ana.errors, [])
    assert.deepEqual(await server.stop(), { code: 0, signal: null })
  })
