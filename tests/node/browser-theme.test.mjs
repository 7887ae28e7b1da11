// Light and dark (issue 19, item 7): the room follows the system's setting until the person
// chooses (a header button, remembered); screenshots of the room in both themes at 1280 and
// 420 px wide go to the screenshot folder (docs/screenshots keeps a set). At 420 px the editor
// and the terminal both have room, and the terminal takes keys (issue 41, item 7).

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { skipUnless, mintToken, openProvider, waitSynced, destroyAll, Y } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('the room is dark when the system is, until the person chooses light', { skip, timeout: 180_000 }, async (t) => {
  const { defer, storage, server, people: [ana] } = await scene(t, ['ana@example.com'])
  const page = ana.page
  await page.emulateMedia({ colorScheme: 'dark' })
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'night shift')
  const c = openProvider(server, roomId, await mintToken(storage, 'ana@example.com'))
  defer(() => destroyAll([c]))
  await waitSynced(c.provider)
  c.doc.getMap('files').set('main.py', new Y.Text('def hello():\n    return "night"\n\nprint(hello())\n'))
  await page.getByText('main.py', { exact: true }).first().click()
  await page.getByTestId('terminal-status').filter({ hasText: 'Connected' }).waitFor({ timeout: 30_000 })
  const theme = () => page.evaluate(() => document.documentElement.dataset.theme)
  const background = () => page.evaluate(() => getComputedStyle(document.documentElement).backgroundColor)
  assert.equal(await theme(), 'dark', 'the system is dark')
  assert.equal(await background(), 'rgb(18, 20, 24)')
  await shot(page, '50-room-dark-1280')
  await page.setViewportSize({ width: 420, height: 800 })
  await shot(page, '51-room-dark-420')
  // At 420 px the editor and the terminal both have room, and the terminal takes keys.
  const height = async (locator) => (await locator.boundingBox())?.height ?? 0
  assert.ok(await height(page.locator('.cm-editor')) >= 150, `the editor is ${await height(page.locator('.cm-editor'))} px tall`)
  const term = page.getByTestId('terminal')
  assert.ok(await height(term) >= 150, `the terminal is ${await height(term)} px tall`)
  await term.scrollIntoViewIfNeeded()
  await term.click()
  await page.keyboard.type('echo narrow-$((40+2))\n', { delay: 10 })
  await page.locator('.xterm-rows').filter({ hasText: 'narrow-42' }).waitFor({ timeout: 20_000 })

  // The person chooses light: kept across a reload, though the system stays dark.
  await page.getByTestId('theme-toggle').click()
  assert.equal(await theme(), 'light')
  assert.equal(await page.getByTestId('theme-toggle').getAttribute('aria-label'), 'Switch to the dark theme')
  await shot(page, '52-room-light-420')
  await page.setViewportSize({ width: 1280, height: 800 })
  await page.reload()
  await page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()
  assert.equal(await theme(), 'light')
  assert.equal(await background(), 'rgb(246, 247, 249)')
  await page.getByText('main.py', { exact: true }).first().click()
  await shot(page, '53-room-light-1280')
})
