// Keyboard only (issue 19's acceptance): invite, run, follow and approve are reached with Tab
// (Shift+Tab from the page's end for the side panel; Esc then Tab leaves the editor, as
// CodeMirror offers) and done with Enter, no mouse.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { skipUnless, waitFor, mintToken, api, openProvider, waitSynced, destroyAll, joinByInvite, Y } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, terminalText } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

/** Moves the focus from where it is to `target` with Tab (or Shift+Tab) alone. */
async function tabTo (page, target, backwards = false) {
  for (let i = 0; i < 150; i++) {
    await page.keyboard.press(backwards ? 'Shift+Tab' : 'Tab')
    if (await target.evaluate((el) => el === document.activeElement).catch(() => false)) return
    // The editor keeps Tab for indenting: Esc, then Tab leaves it.
    if (await page.evaluate(() => document.activeElement?.classList.contains('cm-content'))) await page.keyboard.press('Escape')
  }
  throw new Error(`could not reach ${target} with ${backwards ? 'Shift+Tab' : 'Tab'}`)
}

test('invite, run, follow and approve with the keyboard alone', { skip, timeout: 180_000 }, async (t) => {
  const { defer, storage, server, people: [ana, ben] } = await scene(t, ['ana@example.com', 'ben@example.com'])
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'keys only')
  const anaToken = await mintToken(storage, 'ana@example.com')
  const { token: benToken, id: benId } = await joinByInvite(server, storage, roomId, anaToken, 'ben@example.com')
  assert.equal((await api(server, anaToken, 'PATCH', `/api/rooms/${roomId}/participants/${benId}`, { grant: ['approve'] })).status, 200)
  const c = openProvider(server, roomId, anaToken)
  defer(() => destroyAll([c]))
  await waitSynced(c.provider)
  c.doc.getMap('files').set('main.py', new Y.Text('print("keys-" + str(6 * 7))\n'))
  const page = ana.page
  await page.getByTestId('terminal-status').filter({ hasText: 'Connected' }).waitFor({ timeout: 30_000 })

  // Invite: the People panel's button, then the form's, by Shift+Tab from the page's end.
  await tabTo(page, page.getByTestId('invite-open'), true)
  await page.keyboard.press('Enter')
  await tabTo(page, page.getByTestId('invite-create'))
  await page.keyboard.press('Enter')
  await page.getByTestId('invite-url').waitFor()

  // Run: the terminal bar's button.
  await page.getByTestId('run-command').filter({ hasText: 'python3 main.py' }).waitFor()
  await waitFor(async () => {
    const r = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['cat', 'main.py'] })
    return r.status === 200 && r.body.stdout.includes('keys-')
  }, 20_000, 'main.py did not reach the workspace')
  await tabTo(page, page.getByTestId('run'))
  await page.keyboard.press('Enter')
  await waitFor(async () => (await terminalText(page)).includes('keys-42'), 20_000, 'Run did not run')

  // Follow: Ben reaches Ana's avatar and follows her into main.py; Esc ends it.
  await login(ben, storage.dataDir, `/rooms/${roomId}`)
  await ben.page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()
  await page.getByText('main.py', { exact: true }).first().focus()
  await page.keyboard.press('Enter')
  await tabTo(ben.page, ben.page.getByTestId('avatar-ana@example.com'))
  await ben.page.keyboard.press('Enter')
  await ben.page.getByTestId('following').waitFor()
  await ben.page.locator('.tab.active', { hasText: 'main.py' }).waitFor()
  await ben.page.keyboard.press('Escape')
  await ben.page.getByTestId('following').waitFor({ state: 'hidden' })

  // Approve: Ana asks to export; Ben opens the Approvals panel and approves, by keys.
  const asked = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/exports`, { files: ['main.py'] })
  assert.equal(asked.status, 202, JSON.stringify(asked.body))
  const nav = ben.page.getByRole('tab', { name: 'Approvals' })
  await tabTo(ben.page, nav, true)
  await ben.page.keyboard.press('Enter')
  const approve = ben.page.locator('[data-testid^="approve-"]').first()
  await approve.waitFor()
  await tabTo(ben.page, approve)
  await ben.page.keyboard.press('Enter')
  await ben.page.getByText('Nothing waits for a decision.').waitFor()
  const list = (await api(server, benToken, 'GET', `/api/rooms/${roomId}/approvals`)).body
  const items = Array.isArray(list) ? list : list.approvals
  assert.ok(items.some((a) => a.state === 'approved' || a.state === 'used'), JSON.stringify(items))
})
