// The admin console (issue 19, item 9): a system admin finds Ben and revokes him everywhere;
// the two rooms he has open close on his screens (within a second of the decision, by the
// server's measure); then confirms, from the list, a deletion Ana asked for.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { skipUnless, waitFor, mintToken, api, createRoom, joinByInvite } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, login, shot, shotsAll } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

async function metric (server, name) {
  const text = await (await fetch(`${server.url}/metrics`)).text()
  const line = text.split('\n').find((l) => l.startsWith(`${name} `))
  return line ? Number(line.split(' ')[1]) : 0
}

test('an admin revokes an account everywhere and confirms a deletion from the list', { skip, timeout: 180_000 }, async (t) => {
  const { storage, server, people: [root, ben] } = await scene(t, ['root@example.com', 'ben@example.com'],
    { extraArgs: ['--admin-emails', 'root@example.com'] })
  const ana = await mintToken(storage, 'ana@example.com')
  const rooms = [await createRoom(server, ana, 'first'), await createRoom(server, ana, 'second')]
  for (const r of rooms) await joinByInvite(server, storage, r, ana, 'ben@example.com')

  // Ben has both rooms open, one per tab.
  await login(ben, storage.dataDir, `/rooms/${rooms[0]}`)
  const second = await ben.page.context().newPage()
  await second.goto(`${server.url}/rooms/${rooms[1]}`)
  for (const p of [ben.page, second]) await p.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()

  // The admin finds him.
  await login(root, storage.dataDir, '/admin')
  await root.page.getByTestId('admin-link').waitFor()
  await root.page.getByTestId('account-root@example.com').waitFor()
  await root.page.getByTestId('admin-search').fill('ben@')
  // The search narrows the list.
  await root.page.getByTestId('account-root@example.com').waitFor({ state: 'detached' })
  const account = root.page.getByTestId('account-ben@example.com')
  await account.filter({ hasText: 'In first (editor), second (editor).' }).waitFor()
  await shotsAll(root.page, '44-admin-accounts')

  // Revoke, confirmed by a second click: both of his rooms close on his screens.
  const closesBefore = await metric(server, 'coderoom_access_close_seconds_count')
  await account.getByTestId('revoke-ben@example.com').click()
  await account.getByTestId('revoke-ben@example.com').filter({ hasText: 'Confirm: remove ben@example.com from 2 rooms' }).click()
  for (const p of [ben.page, second]) {
    await p.getByTestId('room-ended').waitFor({ timeout: 10_000 })
  }
  await account.filter({ hasText: 'In no room.' }).waitFor()
  // The console says he cannot log in, and offers to restore him instead of revoking again.
  await account.getByTestId('revoked-ben@example.com').filter({ hasText: 'cannot log in' }).waitFor()
  assert.equal(await account.getByTestId('revoke-ben@example.com').count(), 0)
  await waitFor(async () => (await metric(server, 'coderoom_access_close_seconds_count')) >= closesBefore + 2, 5_000, 'the closes were not measured')
  const count = await metric(server, 'coderoom_access_close_seconds_count')
  const within = await metric(server, 'coderoom_access_close_seconds_bucket{le="1.0"}')
  assert.equal(within, count, `every close within a second of the decision (${within} of ${count})`)
  assert.equal((await api(server, ana, 'GET', `/api/rooms/${rooms[0]}`)).body.participants.some((p) => p.email === 'ben@example.com'), false)

  // Ana asks to delete the second room; the admin confirms it from the list.
  const asked = await api(server, ana, 'DELETE', `/api/rooms/${rooms[1]}`)
  assert.equal(asked.status, 202)
  await root.page.reload()
  const row = root.page.getByTestId(`deletion-${asked.body.deletion_id}`)
  await row.filter({ hasText: 'waiting for you' }).waitFor()
  assert.match(await row.innerText(), /second[\s\S]*Asked by ana@example\.com/)
  await row.getByTestId(`confirm-${asked.body.deletion_id}`).click()
  await row.filter({ hasText: 'deleted' }).waitFor({ timeout: 30_000 })
  await shotsAll(root.page, '45-admin-deletions')
  // The system chain, verified in the browser, says who revoked whom.
  await root.page.getByTestId('admin-chain').filter({ hasText: 'Chain verified in this browser' }).waitFor()
  await root.page.locator('.audit-sentence', { hasText: 'root@example.com revoked ben@example.com everywhere: removed from 2 room(s)' }).waitFor()
  // Restored from the console: he may log in again, and the chain says who let him.
  await account.getByTestId('restore-ben@example.com').click()
  await account.getByTestId('revoked-ben@example.com').waitFor({ state: 'detached' })
  await root.page.reload()
  await root.page.locator('.audit-sentence', { hasText: 'root@example.com restored ben@example.com: it may log in again.' }).waitFor()
  await root.page.getByTestId(`deletion-${asked.body.deletion_id}`).getByRole('link', { name: 'Receipt' }).click()
  await root.page.getByTestId('receipt').waitFor()
  assert.equal((await api(server, ana, 'GET', `/api/rooms/${rooms[1]}`)).status, 404)
})
