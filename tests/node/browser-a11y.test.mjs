// Accessibility (issue 19's acceptance): axe-core, the engine behind most accessibility
// checkers, run in real Chromium on the login page, the room list, the room (light and dark)
// and its Approvals panel with a request waiting, a file deleted under the page with the trash
// open (light and dark, 1280 and 420 px): no serious or critical violation.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { skipUnless, mintToken, openProvider, waitSynced, destroyAll, Y } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, openPanel } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)
const AXE = createRequire(import.meta.url).resolve('axe-core/axe.min.js')

/** Serious and critical violations on the page as it is, one line each. */
async function violations (page) {
  await page.addScriptTag({ path: AXE })
  const found = await page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { resultTypes: ['violations'] })
    return r.violations
      .filter((v) => v.impact === 'serious' || v.impact === 'critical')
      .map((v) => `${v.impact} ${v.id}: ${v.help} (${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join('; ')})`)
  })
  return found
}

test('no serious or critical accessibility violation on the login page, the room list and the room', { skip, timeout: 180_000 }, async (t) => {
  const { defer, storage, server, browser } = await scene(t, [])
  // axe is injected as a script: this context lets it past the page's CSP (script-src 'self').
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, baseURL: server.url, bypassCSP: true })
  const page = await context.newPage()
  const ana = { email: 'ana@example.com', context, page, foreign: [], errors: [] }
  await page.goto('/login')
  await page.getByLabel('Email').waitFor()
  assert.deepEqual(await violations(page), [], 'login page')

  await login(ana, storage.dataDir)
  await page.getByRole('heading', { name: 'Your rooms' }).waitFor()
  const roomId = await createRoomFromPage(ana, 'accessible')
  await page.goto('/')
  await page.getByTestId('room-accessible').waitFor()
  assert.deepEqual(await violations(page), [], 'room list')

  const c = openProvider(server, roomId, await mintToken(storage, 'ana@example.com'))
  defer(() => destroyAll([c]))
  await waitSynced(c.provider)
  c.doc.getMap('files').set('main.py', new Y.Text('print("hi")\n'))
  await page.goto(`/rooms/${roomId}`)
  await page.getByTestId('terminal-status').filter({ hasText: 'Connected' }).waitFor({ timeout: 30_000 })
  await page.getByText('main.py', { exact: true }).first().click()
  assert.deepEqual(await violations(page), [], 'room (light)')
  await page.getByTestId('theme-toggle').click()
  assert.deepEqual(await violations(page), [], 'room (dark)')

  // With a request waiting for her decision: counted on the Approvals tab, told in a notice,
  // its card in words (issue 41), light and dark, wide and 420 px.
  const anaToken = await mintToken(storage, 'ana@example.com')
  const ben = await mintToken(storage, 'ben@example.com')
  const post = (token, path, body) => fetch(`${server.url}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify(body)
  })
  const invite = await post(anaToken, `/api/rooms/${roomId}/invites`, { role: 'owner', ttl_s: 3600, max_uses: 1 }).then((r) => r.json())
  await post(ben, `/api/invites/${invite.token}/accept`, {})
  const agent = await post(ben, `/api/rooms/${roomId}/agents`,
    { name: 'helper-bot', capabilities: ['observe', 'edit', 'type'], ttl_s: 3600, approval_mode: true }).then((r) => r.json())
  const asked = await post(agent.token, `/api/rooms/${roomId}/exec`, { argv: ['pytest', '-q'] })
  assert.equal(asked.status, 202)
  await page.getByTestId('approvals-count').waitFor({ timeout: 15_000 })
  await openPanel(page, 'Approvals')
  await page.locator('li.approval.pending').first().waitFor()
  assert.deepEqual(await violations(page), [], 'approvals (dark)')
  await page.setViewportSize({ width: 420, height: 800 })
  assert.deepEqual(await violations(page), [], 'approvals (dark, 420 px)')
  await page.getByTestId('theme-toggle').click()
  assert.deepEqual(await violations(page), [], 'approvals (light, 420 px)')
  await page.setViewportSize({ width: 1280, height: 800 })
  assert.deepEqual(await violations(page), [], 'approvals (light)')
  // The audit log in words, with its filters.
  await openPanel(page, 'Audit')
  await page.getByTestId('audit-who').waitFor()
  assert.deepEqual(await violations(page), [], 'audit (light)')
  // The invite form with its capabilities and address (issue 41), and the grouped panels.
  await openPanel(page, 'People')
  await page.getByTestId('invite-open').click()
  await page.getByTestId('invite-email').waitFor()
  assert.deepEqual(await violations(page), [], 'invite form (light)')
  await page.getByTestId('panel-group-Settings').click()
  assert.deepEqual(await violations(page), [], 'settings group (light)')
  // A file deleted under the page by someone else (its tab kept, marked deleted, and a notice
  // offering to restore it) and the trash in the file tree (issue 41), both themes and widths.
  c.doc.getMap('files').delete('main.py')
  await page.getByTestId('file-deleted').waitFor({ timeout: 15_000 })
  await page.getByTestId('trash').locator('summary').click()
  await page.getByTestId('trash-list').getByText('main.py').waitFor()
  assert.deepEqual(await violations(page), [], 'deleted file and trash (light)')
  await page.getByTestId('theme-toggle').click()
  assert.deepEqual(await violations(page), [], 'deleted file and trash (dark)')
  await page.setViewportSize({ width: 420, height: 800 })
  assert.deepEqual(await violations(page), [], 'deleted file and trash (dark, 420 px)')
  await page.getByTestId('theme-toggle').click()
  assert.deepEqual(await violations(page), [], 'deleted file and trash (light, 420 px)')
})
