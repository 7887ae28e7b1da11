// The Spend panel in a real browser: the owner sets a budget there, the room's commands use it
// up (the page is told at once), the panel shows the meters and who used what, and a raise
// asked from the panel waits for someone else's approval, then applies from the panel.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { skipUnless, waitFor, mintToken, api, joinByInvite } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot, openPanel } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('a budget set from the Spend panel stops commands, and a raise waits for an approval', { skip, timeout: 180_000 }, async (t) => {
  const { storage, server, people: [ana] } = await scene(t, ['ana@example.com'])
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'on a budget')
  const page = ana.page
  const anaToken = await mintToken(storage, 'ana@example.com')
  const { token: benToken, id: benId } = await joinByInvite(server, storage, roomId, anaToken, 'ben@example.com')
  // Ben may approve (he is the someone else a raise needs).
  assert.equal((await api(server, anaToken, 'PATCH', `/api/rooms/${roomId}/participants/${benId}`, { grant: ['approve'] })).status, 200)

  await openPanel(page, 'Spend')
  await page.getByTestId('spend-no-budget').waitFor()
  await page.getByTestId('budget-execs').fill('2')
  await page.getByTestId('budget-save').click()
  await page.getByTestId('spend-execs').filter({ hasText: 'Commands run' }).filter({ hasText: '2' }).waitFor()

  // Two commands use it up; the third is refused with the meter and the budget, and the page
  // is told.
  for (const i of [1, 2]) {
    const r = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['sh', '-c', `echo ${i}`] })
    assert.equal(r.status, 200, JSON.stringify(r.body))
  }
  const refused = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['true'] })
  assert.equal(refused.status, 402)
  assert.deepEqual([refused.body.meter, refused.body.used, refused.body.budget], ['execs', 2, 2])
  await page.locator('.toast').filter({ hasText: "the room's budget of commands is spent" }).waitFor({ timeout: 10_000 })
  await page.getByRole('button', { name: 'Refresh' }).click()
  await page.getByTestId('spend-execs').filter({ hasText: 'spent' }).waitFor()
  await page.getByTestId('spend-who-ana@example.com').filter({ hasText: 'Commands run: 2' }).waitFor()
  await shot(page, '25-spend-panel')

  // A raise from the panel waits for Ben's approval, then applies from the panel. The save
  // redraws the panel once it is told (the marker goes with the old table).
  await page.getByTestId('budget-execs').fill('5')
  await page.getByTestId('spend-meters').evaluate((el) => { el.dataset.before = 'save' })
  await page.getByTestId('budget-save').click()
  await page.locator('.toast').filter({ hasText: 'someone who holds approve decides' }).waitFor()
  await page.locator('[data-testid="spend-meters"]:not([data-before])').waitFor({ timeout: 15_000 })
  let pending
  await waitFor(async () => {
    const list = (await api(server, benToken, 'GET', `/api/rooms/${roomId}/approvals`)).body
    pending = (Array.isArray(list) ? list : list.approvals).find((a) => a.action === 'set_budget' && a.state === 'pending')
    return pending !== undefined
  }, 10_000, 'no pending raise')
  assert.deepEqual(pending.params.budget, { execs: 5 })
  // Ana types the raise again and selects it whole to type over while Ben decides: the panel
  // redraws live with the decision, and what she typed, her focus and her selection stay.
  await page.getByTestId('budget-execs').fill('5')
  await page.getByTestId('budget-execs').selectText()
  await page.getByTestId('spend-meters').evaluate((el) => { el.dataset.before = 'decision' })
  assert.equal((await api(server, benToken, 'POST', `/api/rooms/${roomId}/approvals/${pending.id}/decision`, { approve: true })).status, 200)
  await page.locator('[data-testid="spend-meters"]:not([data-before])').waitFor({ timeout: 15_000 })
  assert.deepEqual(await page.getByTestId('budget-execs').evaluate((el) =>
    [el.value, el === document.activeElement, el.selectionStart, el.selectionEnd]), ['5', true, 0, 1])
  await page.keyboard.type('5')
  assert.equal(await page.getByTestId('budget-execs').inputValue(), '5')
  await page.getByTestId('budget-save').click()
  await page.locator('.toast').filter({ hasText: 'Budget saved.' }).last().waitFor()
  await waitFor(async () => (await api(server, anaToken, 'GET', `/api/rooms/${roomId}/spend`)).body.budget?.execs === 5, 10_000, 'the raise did not apply')
  const ran = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['true'] })
  assert.equal(ran.status, 200, JSON.stringify(ran.body))
  assert.deepEqual(ana.errors, [])
  assert.deepEqual(await server.stop(), { code: 0, signal: null })
})
