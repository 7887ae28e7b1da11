// Approvals nobody misses (issue 41, item 4), with two people and an agent: what waits for a
// person's decision is counted on their Approvals tab and told to them as it is asked (not to
// the agent's sponsor, who may not decide it, nor to the one who asked); the card says in words
// who asks what, beside the exact parameters; and a panel showing something that waited (the
// asker's Previews panel) shows its decision without a Refresh.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { api, mintToken, skipUnless, freePort, joinByInvite } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shotsAll, openPanel } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('approvals are counted, told and worded for whoever decides; the asker\'s panel follows the decision',
  { skip, timeout: 240_000 }, async (t) => {
    const previewPort = await freePort()
    const s = await scene(t, ['ana@example.com', 'ben@example.com'], {
      extraArgs: ['--preview-url', `http://{id}.preview.localhost:${previewPort}`, '--preview-listen', `127.0.0.1:${previewPort}`]
    })
    const { storage, server, people: [ana, ben] } = s
    await login(ana, storage.dataDir)
    const roomId = await createRoomFromPage(ana, 'approvals')
    const anaToken = await mintToken(storage, 'ana@example.com')
    await joinByInvite(server, storage, roomId, anaToken, 'ben@example.com', 'owner')
    await login(ben, storage.dataDir, `/rooms/${roomId}`)
    await ben.page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()

    // Ana brings in an agent in approval mode; its command waits for someone else.
    const made = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/agents`,
      { name: 'helper-bot', capabilities: ['observe', 'edit', 'type'], ttl_s: 3600, approval_mode: true })
    assert.equal(made.status, 201, JSON.stringify(made.body))
    const asked = await api(server, made.body.token, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['sh', '-c', 'pytest -q'] })
    assert.equal(asked.status, 202, JSON.stringify(asked.body))

    // Ben, who may decide it, is told and sees it counted; Ana, its sponsor, is neither.
    const said = ben.page.locator('[data-testid^="asked-"]')
    await said.filter({ hasText: 'helper-bot (an agent brought in by ana@example.com) asks to run `pytest -q`' }).waitFor({ timeout: 15_000 })
    const count = ben.page.getByTestId('approvals-count')
    await count.filter({ hasText: '1' }).waitFor()
    assert.equal(await ana.page.getByTestId('approvals-count').count(), 0)
    assert.equal(await ana.page.locator('[data-testid^="asked-"]').count(), 0)

    // The card: who asks what, in words, and the exact parameters.
    await openPanel(ben.page, 'Approvals')
    const card = ben.page.locator('li.approval.pending').first()
    await card.getByText('helper-bot (an agent brought in by ana@example.com) asks to run `pytest -q`').waitFor()
    await card.locator('pre.params', { hasText: '"pytest -q"' }).waitFor()
    await card.getByText('waiting for a decision').waitFor()
    await shotsAll(ben.page, '60-approvals-in-words')

    // Ana asks for a public preview; her Previews panel says it waits.
    const preview = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/previews`, { port: 8000, visibility: 'public', ttl_s: 3600 })
    assert.equal(preview.status, 201, JSON.stringify(preview.body))
    await openPanel(ana.page, 'Previews')
    const row = ana.page.getByTestId('preview').filter({ hasText: 'Port 8000' })
    await row.getByTestId('preview-state').filter({ hasText: 'waiting for approval' }).waitFor()

    // Ben is told of it too (two waiting now), and approves it from his panel.
    await said.filter({ hasText: 'ana@example.com asks to make port 8000 public to anyone with the link for 1 hour' }).waitFor({ timeout: 15_000 })
    await count.filter({ hasText: '2' }).waitFor({ timeout: 15_000 })
    await ben.page.getByRole('button', { name: 'Refresh' }).click()
    await ben.page.getByTestId(`approve-${preview.body.approval_id}`).click()

    // Ana's Previews panel follows without a Refresh; Ben's count drops.
    await row.getByTestId('preview-state').filter({ hasText: 'live' }).waitFor({ timeout: 15_000 })
    await count.filter({ hasText: '1' }).waitFor({ timeout: 15_000 })
    assert.deepEqual(ana.errors, [])
    assert.deepEqual(ben.errors, [])
  })
