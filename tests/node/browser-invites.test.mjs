// Invites by email with the capabilities chosen (issue 41, item 8): Ana invites ben by address,
// to watch, edit and export but not type; the mail reaches him with the link, which says what
// it grants; someone else with the same link is told it is not theirs and cannot join; Ben
// joins holding exactly what was chosen. The form offers only what Ana holds.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readdir, readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { api, mintToken, skipUnless, waitFor } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shotsAll } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

/** The invite link in the newest mail to `email` in the dev outbox (quoted-printable undone). */
async function invitedLink (dataDir, email) {
  let link = null
  await waitFor(async () => {
    const dir = join(dataDir, 'outbox')
    let names = []
    try { names = await readdir(dir) } catch { return false }
    for (const n of names.filter((n) => n.endsWith('.eml'))) {
      const text = (await readFile(join(dir, n), 'utf8')).replace(/=\r?\n/g, '').replace(/=3D/g, '=')
      if (!new RegExp(`^To: .*${email.replace(/[.@]/g, '\\$&')}`, 'mi').test(text) || !text.includes('invites you')) continue
      const m = text.match(/https?:\/\/\S+\/invite\/inv_[0-9a-f]{64}/)
      if (m) link = m[0]
    }
    return link !== null
  }, 15_000, `no invite mailed to ${email}`, 100)
  return link
}

test('an invite by email grants what was chosen, to that address alone', { skip, timeout: 240_000 }, async (t) => {
  const s = await scene(t, ['ana@example.com', 'ben@example.com', 'cy@example.com'])
  const { storage, server, people: [ana, ben, cy] } = s
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'by invitation')
  const { page } = ana

  await page.getByTestId('invite-open').click()
  await page.getByTestId('invite-role').selectOption('editor')
  // The role's capabilities come checked; Ana changes them (she holds every one as owner).
  assert.equal(await page.getByTestId('invite-cap-type').isChecked(), true)
  await page.getByTestId('invite-cap-type').uncheck()
  await page.getByTestId('invite-cap-export').check()
  await page.getByTestId('invite-email').fill('Ben@Example.com')
  await shotsAll(page, '67-invite-by-email')
  await page.getByTestId('invite-create').click()
  await page.getByTestId('invite-said').filter({ hasText: 'Sent to ben@example.com: only that account can join with it, once, to watch the room, edit files and fork and export.' }).waitFor()

  const link = await invitedLink(storage.dataDir, 'ben@example.com')
  const path = new URL(link).pathname

  // Someone else with the link is told it is not theirs.
  await login(cy, storage.dataDir, path)
  await cy.page.getByTestId('invite-error').filter({ hasText: 'This invite was sent to someone else' }).waitFor()
  // Nothing of it shown: not the room, not the address.
  assert.equal(await cy.page.getByRole('button', { name: 'Join the room' }).isVisible(), false)
  assert.doesNotMatch(await cy.page.locator('main').innerText(), /ben@example\.com|by invitation/)
  const cyToken = await mintToken(storage, 'cy@example.com')
  const sneaky = await api(server, cyToken, 'POST', `/api/invites/${path.split('/').pop()}/accept`, {})
  assert.equal(sneaky.status, 403)
  assert.equal((await api(server, cyToken, 'GET', `/api/invites/${path.split('/').pop()}`)).status, 403)

  // Ben reads what it grants, joins, and holds exactly that.
  await login(ben, storage.dataDir, path)
  await ben.page.getByTestId('invite-offer').filter({ hasText: 'ana@example.com invited you to by invitation, to watch the room, edit files and fork and export.' }).waitFor()
  await ben.page.getByRole('button', { name: 'Join the room' }).click()
  await ben.page.waitForURL(new RegExp(`/rooms/${roomId}$`))
  const benToken = await mintToken(storage, 'ben@example.com')
  const room = await api(server, benToken, 'GET', `/api/rooms/${roomId}`)
  assert.deepEqual(room.body.my_capabilities, ['observe', 'edit', 'export'])
  // An editor without invite is offered no invite form.
  assert.equal(await ben.page.getByTestId('invite-open').count(), 0)
  assert.deepEqual(ana.errors, [])
  assert.deepEqual(ben.errors, [])
})
