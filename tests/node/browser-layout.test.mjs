// The room's layout (issue 19, item 3): the split between editor and terminal is dragged (and
// moved with the keyboard), the side panel folded away, the terminal maximised; after a reload
// the sizes, the folded panel and the open tabs (the active one active) are as they were, and
// the shell's terminal size follows the pane it is drawn in.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { skipUnless, waitFor, mintToken, openProvider, waitSynced, destroyAll, Y } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot, shotsAll, terminalText } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('the split, the folded panel and the open tabs come back after a reload', { skip, timeout: 180_000 }, async (t) => {
  const { defer, storage, server, people: [ana] } = await scene(t, ['ana@example.com'])
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'layout')
  const page = ana.page
  const c = openProvider(server, roomId, await mintToken(storage, 'ana@example.com'))
  defer(() => destroyAll([c]))
  await waitSynced(c.provider)
  c.doc.getMap('files').set('a.py', new Y.Text('print("a")\n'))
  c.doc.getMap('files').set('b.md', new Y.Text('# b\n'))
  await page.getByTestId('terminal-status').filter({ hasText: 'Connected' }).waitFor({ timeout: 30_000 })
  const terminal = page.getByTestId('terminal')
  const height = async () => (await terminal.boundingBox()).height
  const rows = async () => {
    const before = (await terminalText(page)).length
    await terminal.click()
    await page.keyboard.type('echo rows=$(stty size | cut -d" " -f1)=\n', { delay: 5 })
    let n = null
    await waitFor(async () => {
      const m = (await terminalText(page)).slice(before).match(/rows=(\d+)=/)
      n = m ? Number(m[1]) : null
      return n !== null
    }, 20_000, 'stty did not answer')
    return n
  }

  // Two tabs, the first one active.
  await page.getByText('a.py', { exact: true }).first().click()
  await page.getByText('b.md', { exact: true }).first().click()
  await page.locator('.tabs .tab-name', { hasText: 'a.py' }).click()
  await page.locator('.tab.active', { hasText: 'a.py' }).waitFor()

  // The split dragged up by 150 px: the terminal grows by as much, and the shell is told.
  const rowsBefore = await rows()
  const h0 = await height()
  const box = await page.getByTestId('split').boundingBox()
  await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2)
  await page.mouse.down()
  await page.mouse.move(box.x + box.width / 2, box.y - 150, { steps: 5 })
  await page.mouse.up()
  await waitFor(async () => Math.abs((await height()) - (h0 + 150)) <= 8, 5_000, `the terminal did not grow: ${h0} -> ${await height()}`)
  await waitFor(async () => (await rows()) > rowsBefore, 20_000, 'the shell\'s terminal did not grow with its pane')
  // And by the keyboard: one step up is 24 px more.
  const h1 = await height()
  await page.getByTestId('split').focus()
  await page.keyboard.press('ArrowUp')
  await waitFor(async () => Math.abs((await height()) - (h1 + 24)) <= 4, 5_000, 'ArrowUp did not move the split')
  const h2 = await height()

  // The file tree made wider by its edge (issue 41, item 7), and narrower by a key.
  const filesWidth = async () => (await page.locator('aside.files').boundingBox()).width
  const w0 = await filesWidth()
  const edge = await page.getByTestId('files-split').boundingBox()
  await page.mouse.move(edge.x + edge.width / 2, edge.y + 200)
  await page.mouse.down()
  await page.mouse.move(edge.x + edge.width / 2 + 120, edge.y + 200, { steps: 5 })
  await page.mouse.up()
  await waitFor(async () => Math.abs((await filesWidth()) - (w0 + 120)) <= 8, 5_000, `the file tree did not widen: ${w0} -> ${await filesWidth()}`)
  const w1 = await filesWidth()
  await page.getByTestId('files-split').focus()
  await page.keyboard.press('ArrowLeft')
  await waitFor(async () => Math.abs((await filesWidth()) - (w1 - 24)) <= 4, 5_000, 'ArrowLeft did not move the tree\'s edge')
  const w2 = await filesWidth()

  // The side panels in groups: two short rows (the groups, the group's panels), not three.
  const rowHeight = async (sel) => (await page.locator(sel).boundingBox()).height
  assert.ok(await rowHeight('.side-groups') < 48, `the groups take ${await rowHeight('.side-groups')} px`)
  assert.ok(await rowHeight('.side-nav') < 48, `the panels take ${await rowHeight('.side-nav')} px`)
  assert.deepEqual(await page.getByRole('tab').allInnerTexts(), ['People', 'Approvals', 'Audit'])
  await page.getByTestId('panel-group-Settings').click()
  assert.deepEqual(await page.getByRole('tab').allInnerTexts(), ['Room', 'Secrets', 'Network', 'Spend'])
  await page.locator('.side-body h2', { hasText: 'Room' }).waitFor()
  await page.getByTestId('panel-group-Team').click()
  await page.getByRole('tab', { name: 'People', selected: true }).waitFor()
  await shotsAll(page, '69-grouped-panels-wide-tree')

  // The side panel folded away.
  await page.getByTestId('side-toggle').click()
  await page.locator('.side-body').waitFor({ state: 'hidden' })
  assert.equal(await page.getByTestId('side-toggle').getAttribute('aria-expanded'), 'false')
  await shotsAll(page, '42-layout-split-folded')

  // After a reload: the same terminal height, the panel still folded, the same tabs.
  await page.reload()
  await page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()
  await page.locator('.tab.active', { hasText: 'a.py' }).waitFor()
  assert.deepEqual(await page.locator('.tabs .tab-name').allInnerTexts(), ['a.py', 'b.md'])
  assert.match(await page.locator('.cm-content').innerText(), /print\("a"\)/)
  await waitFor(async () => Math.abs((await height()) - h2) <= 2, 5_000, `the terminal's height was not kept: ${h2} -> ${await height()}`)
  assert.equal(await page.locator('.side-body').isVisible(), false, 'the side panel stays folded')
  await waitFor(async () => Math.abs((await filesWidth()) - w2) <= 2, 5_000, `the file tree's width was not kept: ${w2} -> ${await filesWidth()}`)

  // Quick open: Ctrl+P, a few letters, Enter.
  await page.locator('.cm-content').click()
  await page.keyboard.press('Control+P')
  await page.getByTestId('quick-open').waitFor()
  await page.keyboard.type('bmd')
  assert.deepEqual(await page.locator('.quick-list li').allInnerTexts(), ['b.md'])
  await page.keyboard.press('Enter')
  await page.locator('.tab.active', { hasText: 'b.md' }).waitFor()
  assert.equal(await page.getByTestId('quick-open').count(), 0, 'the dialog closed')
  assert.match(await page.locator('.cm-content').innerText(), /# b/)
  // Markdown is highlighted once its mode has loaded (a chunk fetched on first use): the
  // heading is drawn as a styled span, where plain text has none.
  await page.locator('.cm-line span', { hasText: 'b' }).first().waitFor({ timeout: 10_000 })
  // Search across files: Ctrl+Shift+F, the text, Enter opens where it is.
  await page.keyboard.press('Control+Shift+F')
  await page.getByTestId('search-files').waitFor()
  await page.keyboard.type('PRINT')
  assert.deepEqual(await page.locator('.quick-list li').allInnerTexts(), ['a.py:1 print("a")'])
  await page.keyboard.press('Enter')
  await page.locator('.tab.active', { hasText: 'a.py' }).waitFor()

  // Upload: a text file becomes a file of the room; a binary one is refused, saying why.
  await page.getByTestId('upload-input').setInputFiles([
    { name: 'up.txt', mimeType: 'text/plain', buffer: Buffer.from('uploaded text\n') },
    { name: 'bin.dat', mimeType: 'application/octet-stream', buffer: Buffer.from([0x41, 0x00, 0x42]) },
  ])
  await page.locator('.tab.active', { hasText: 'up.txt' }).waitFor()
  await page.locator('.toast', { hasText: 'bin.dat is not text (it holds NUL bytes): only text files go into the room.' }).waitFor()
  await waitFor(() => c.doc.getMap('files').get('up.txt')?.toString() === 'uploaded text\n', 10_000, 'the upload did not reach another client')
  assert.equal(c.doc.getMap('files').get('bin.dat'), undefined)
  // Download: the file's text, saved under its name.
  const downloading = page.waitForEvent('download')
  await page.getByTestId('download-up.txt').click()
  const saved = await downloading
  assert.equal(saved.suggestedFilename(), 'up.txt')
  const { readFile } = await import('node:fs/promises')
  assert.equal(await readFile(await saved.path(), 'utf8'), 'uploaded text\n')

  // Maximised, the terminal fills the work area; Restore brings the editor back.
  await page.getByTestId('side-toggle').click()
  await page.locator('.side-body').waitFor()
  await page.getByTestId('term-max').click()
  await page.locator('.cm-content').waitFor({ state: 'hidden' })
  assert.ok((await height()) > h2, 'the maximised terminal is taller')
  await page.getByTestId('term-max').click()
  await page.locator('.cm-content').waitFor()
  await waitFor(async () => Math.abs((await height()) - h2) <= 2, 5_000, 'Restore did not bring the split back')
})
