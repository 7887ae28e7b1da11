// Being told when your own rights change (issue 19, item 5): Ana lowers Ben to viewer from her
// People panel, and Ben's page says at once who did it and what it means, turns his editor
// read-only, and says so again when he can edit and type again; a grant that only takes typing
// away (and gives it back) is named as such. A role change asks once, in words, before it
// happens (issue 41, item 8).

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { skipUnless, mintToken, api, joinByInvite } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot, shotsAll } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('a rights change is told to the person it changes, naming who made it', { skip, timeout: 180_000 }, async (t) => {
  const { storage, server, people: [ana, ben] } = await scene(t, ['ana@example.com', 'ben@example.com'])
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'rights')
  const anaToken = await mintToken(storage, 'ana@example.com')
  const { id: benId } = await joinByInvite(server, storage, roomId, anaToken, 'ben@example.com')
  await login(ben, storage.dataDir, `/rooms/${roomId}`)
  await ben.page.getByTestId('terminal-status').filter({ hasText: 'Connected' }).waitFor({ timeout: 30_000 })
  const notice = ben.page.getByTestId('rights-notice')
  assert.equal(await notice.count(), 0, 'nothing is said on arrival')

  // Ana makes Ben a viewer from her People panel.
  await ana.page.getByTestId('person-ben@example.com').waitFor({ timeout: 10_000 })
  // Choosing asks once, in words (issue 41, item 8): nothing changes until it is confirmed.
  await ana.page.getByTestId('role-ben@example.com').selectOption('viewer')
  const confirm = ana.page.getByTestId('role-ben@example.com-confirm').filter({ hasText: 'Make ben@example.com a viewer' })
  await confirm.waitFor()
  const room = async () => (await api(server, anaToken, 'GET', `/api/rooms/${roomId}`)).body
  assert.equal((await room()).participants.find((p) => p.user_id === benId).role, 'editor', 'a choice alone changed the role')
  await shotsAll(ana.page, '62-role-change-asks')
  await confirm.click()
  await notice.filter({ hasText: 'ana@example.com made you a viewer: you can watch, but not edit or type.' }).waitFor({ timeout: 10_000 }).catch(async (e) => { throw new Error(`${e.message}: toasts: ${await ben.page.locator('#toasts').innerText().catch(() => 'none')}; ana: ${await ana.page.locator('#toasts').innerText().catch(() => 'none')}`) })
  assert.equal(await ben.page.locator('#toasts').getAttribute('aria-live'), 'polite', 'read out by screen readers')
  await ben.page.locator('.room.viewer').waitFor()
  await shotsAll(ben.page, '46-rights-notice')

  // Back to editor: told again, and the editor takes keys again.
  await ana.page.getByTestId('role-ben@example.com').selectOption('editor')
  await ana.page.getByTestId('role-ben@example.com-confirm').click()
  await notice.filter({ hasText: 'ana@example.com made you an editor: you can edit files and run commands.' }).waitFor({ timeout: 10_000 })
  await ben.page.locator('.room:not(.viewer)').waitFor()

  // Only typing is taken away, then given back.
  const patch = async (body) => assert.equal((await api(server, anaToken, 'PATCH', `/api/rooms/${roomId}/participants/${benId}`, body)).status, 200)
  await patch({ revoke: ['type'] })
  await notice.filter({ hasText: 'You can no longer type in the terminal (ana@example.com).' }).waitFor({ timeout: 10_000 })
  await patch({ grant: ['type'] })
  await notice.filter({ hasText: 'You can type again (ana@example.com).' }).waitFor({ timeout: 10_000 })
  // One notice at a time: each replaces the last.
  assert.equal(await notice.count(), 1)
  await notice.getByRole('button', { name: 'Dismiss' }).click()
  assert.equal(await notice.count(), 0)
})
