// The room list (issue 19, item 6): each room with your role and what it means, how many are
// in it, when it was last active and its sandbox's state; leave a room (with a confirming
// second click; the last owner cannot), and ask for a room's deletion (owners).

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { skipUnless, mintToken, api, createRoom, joinByInvite } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, login, shot } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('the room list says what each room is to you, and lets you leave or ask to delete it', { skip, timeout: 180_000 }, async (t) => {
  const { storage, server, people: [ana, ben] } = await scene(t, ['ana@example.com', 'ben@example.com'])
  const anaToken = await mintToken(storage, 'ana@example.com')
  const alpha = await createRoom(server, anaToken, 'alpha')
  await createRoom(server, anaToken, 'beta')
  const { token: benToken } = await joinByInvite(server, storage, alpha, anaToken, 'ben@example.com')

  await login(ben, storage.dataDir)
  const row = ben.page.getByTestId('room-alpha')
  await row.filter({ hasText: 'editor: can edit files and run commands · 2 people · last active' }).waitFor()
  assert.match(await row.innerText(), /sandbox not started yet/)
  assert.equal(await row.getByTestId('delete-alpha').count(), 0, 'only owners may ask to delete')
  await shot(ben.page, '47-room-list')

  // Ben leaves alpha: a second click confirms; the room is gone from his list and he from it.
  await row.getByTestId('leave-alpha').click()
  await row.getByTestId('leave-alpha').filter({ hasText: 'Confirm: leave this room' }).click()
  await row.waitFor({ state: 'detached' })
  assert.equal((await api(server, benToken, 'GET', `/api/rooms/${alpha}`)).status, 404)
  const people = (await api(server, anaToken, 'GET', `/api/rooms/${alpha}`)).body.participants
  assert.deepEqual(people.map((p) => p.email), ['ana@example.com'])

  // Ana, the only owner, cannot leave beta; she can ask for its deletion.
  await login(ana, storage.dataDir)
  const beta = ana.page.getByTestId('room-beta')
  await beta.filter({ hasText: 'owner: can do everything here' }).waitFor()
  await beta.getByTestId('leave-beta').click()
  await beta.getByTestId('leave-beta').click()
  await beta.locator('[role="status"]').filter({ hasText: /\S/ }).waitFor()
  await beta.getByTestId('delete-beta').click()
  await beta.getByTestId('delete-beta').filter({ hasText: 'Click again' }).click()
  await beta.locator('[role="status"]').filter({ hasText: 'Deletion asked: a system admin must confirm it.' }).waitFor()
})
