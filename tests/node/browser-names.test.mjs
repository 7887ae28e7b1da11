// Display names people choose (issue 41, item 8): Ana calls herself "Ana Lima"; Ben, in the
// room with her, sees that name on her avatar and in the People panel (her email beside it),
// and the audit log says "Ana Lima (ana@example.com)". A name that reads as an email is
// refused, with the reason.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { api, mintToken, skipUnless, joinByInvite } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shotsAll, openPanel, axeViolations } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('a display name is what others see, with the email beside it where it counts', { skip, timeout: 180_000 }, async (t) => {
  const s = await scene(t, ['ana@example.com', 'ben@example.com'])
  const { storage, server, people: [ana, ben] } = s
  await login(ana, storage.dataDir)
  const { page } = ana
  await page.getByTestId('display-name').fill('bob@example.com')
  await page.getByTestId('display-name-save').click()
  await page.getByText('a display name holds no @').waitFor()
  await page.getByTestId('display-name').fill('  Ana Lima ')
  await page.getByTestId('display-name-save').click()
  await page.getByTestId('me').filter({ hasText: 'Ana Lima (ana@example.com)' }).waitFor()
  const anaToken = await mintToken(storage, 'ana@example.com')
  assert.equal((await api(server, anaToken, 'GET', '/api/me')).body.display_name, 'Ana Lima')

  const roomId = await createRoomFromPage(ana, 'named')
  await joinByInvite(server, storage, roomId, anaToken, 'ben@example.com', 'editor')
  await login(ben, storage.dataDir, `/rooms/${roomId}`)
  await ben.page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()
  // Her presence carries the name the server stamps (she cannot be shown as anyone else).
  await ben.page.getByTestId('avatar-Ana Lima').waitFor()
  await ben.page.getByTestId('name-ana@example.com').filter({ hasText: 'Ana Lima' }).waitFor()
  await ben.page.getByTestId('person-ana@example.com').filter({ hasText: 'ana@example.com' }).waitFor()
  await shotsAll(ben.page, '68-display-names')
  assert.deepEqual(await axeViolations(ben.page), [], 'people with display names (light)')
  await openPanel(page, 'Audit')
  await page.getByText('Ana Lima (ana@example.com) created the room.').waitFor()
  // Blank: her email again.
  const cleared = await api(server, anaToken, 'PUT', '/api/me', { display_name: '  ' })
  assert.equal(cleared.status, 200)
  assert.equal(cleared.body.display_name, null)
  assert.equal((await api(server, anaToken, 'PUT', '/api/me', { display_name: 'x'.repeat(65) })).status, 400)
  assert.equal((await api(server, anaToken, 'PUT', '/api/me', { display_name: 'Ana\u202eLima' })).status, 400)
  assert.equal((await api(server, anaToken, 'PUT', '/api/me', { display_name: 'Ana\u200bLima' })).status, 400)
  assert.equal((await api(server, anaToken, 'PUT', '/api/me', { display_name: 'ana\uff20example.com' })).status, 400)
  // Nobody takes a name someone else is shown by (any case); an agent takes none at all.
  assert.equal((await api(server, anaToken, 'PUT', '/api/me', { display_name: 'Ana Lima' })).status, 200)
  const benToken = await mintToken(storage, 'ben@example.com')
  const taken = await api(server, benToken, 'PUT', '/api/me', { display_name: 'ana lima' })
  assert.equal(taken.status, 409, JSON.stringify(taken.body))
  const agent = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/agents`, { name: 'helper-bot', capabilities: ['observe'], ttl_s: 3600 })
  assert.equal(agent.status, 201, JSON.stringify(agent.body))
  assert.equal((await api(server, agent.body.token, 'PUT', '/api/me', { display_name: 'Ana Lima 2' })).status, 403)
  assert.deepEqual(ana.errors, [])
  assert.deepEqual(ben.errors, [])
})
