// The Checkpoints panel in a real browser: make a checkpoint, change the file, restore it (two
// clicks) and see the editor go back; a readiness step that fails is shown with its output while
// the room keeps working; a fork opens a room of one's own that says where it came from.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { skipUnless, waitFor, mintToken, api } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot, editorText, terminalText } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('checkpoints are made, restored and forked from the page; readiness shows where it is',
  { skip, timeout: 240_000 }, async (t) => {
    const { storage, server, people: [ana] } = await scene(t, ['ana@example.com'])
    const { page } = ana
    await login(ana, storage.dataDir)
    const roomId = await createRoomFromPage(ana, 'checkpointed')
    const token = await mintToken(storage, 'ana@example.com')
    await page.getByTestId('terminal-status').filter({ hasText: 'Connected' }).waitFor({ timeout: 30_000 })

    await page.keyboard.press('Alt+N')
    await page.getByTestId('file-path').fill('plan.md')
    await page.getByTestId('file-path').press('Enter')
    await page.locator('.cm-content').click()
    await page.keyboard.type('step one', { delay: 5 })
    await waitFor(async () => (await api(server, token, 'GET', `/api/rooms/${roomId}/sandbox`)).body?.file_sync?.files === 1,
      15_000, 'the file never reached the workspace')

    // Alt+4 opens the Checkpoints panel; a failing readiness step is saved there.
    await page.keyboard.press('Alt+4')
    await page.getByTestId('readiness-command').fill('echo installing deps; exit 7')
    await page.getByTestId('readiness-save').click()
    await page.getByText('Saved: it runs when the sandbox next starts.').waitFor()
    await page.getByTestId('readiness').filter({ hasText: 'Runs when the sandbox next starts' }).waitFor()
    await page.getByTestId('checkpoint-name').fill('before the rewrite')
    await page.getByTestId('checkpoint-make').click()
    // Its own row (a restore keeps the room as it was just before as "before restoring ...").
    const item = page.getByTestId('checkpoint').filter({ has: page.getByText('before the rewrite', { exact: true }) })
    await item.waitFor()

    await page.locator('.cm-content').click()
    await page.keyboard.press('Control+End')
    await page.keyboard.type(' and a broken rewrite', { delay: 5 })
    await waitFor(async () => (await editorText(page)) === 'step one and a broken rewrite', 5000, 'typing did not land')

    // Restore asks twice; the editor goes back for everyone, live.
    const restore = item.getByRole('button', { name: /^Restore/ })
    await restore.click()
    await item.getByRole('button', { name: 'Restore: click again to confirm' }).click()
    await waitFor(async () => (await editorText(page)) === 'step one', 20_000,
      async () => `the editor reads ${JSON.stringify(await editorText(page))}`)
    // The sandbox restarted on the restored workspace and ran the readiness step, which failed:
    // shown with its output, and the room still works.
    await page.getByTestId('readiness').filter({ hasText: 'exited with 7' }).waitFor({ timeout: 30_000 })
    assert.match(await page.getByTestId('readiness-output').innerText(), /installing deps/)
    await shot(page, '16-checkpoints-not-ready')
    await page.getByTestId('terminal-status').filter({ hasText: 'Connected' }).waitFor({ timeout: 30_000 })
    await page.getByTestId('terminal').click()
    await page.keyboard.type('cat plan.md; echo; echo sum-$((3+4))\n', { delay: 5 })
    await waitFor(async () => /step one\s+sum-7/.test(await terminalText(page)), 20_000,
      async () => `the terminal shows ${JSON.stringify((await terminalText(page)).slice(-300))}`)

    // Fork: a room of one's own, which says where it came from.
    await page.keyboard.press('Alt+4')
    await item.getByRole('button', { name: 'Fork' }).click()
    await item.getByRole('button', { name: 'Fork: click again' }).click()
    await page.waitForURL((u) => /\/rooms\/[A-Za-z0-9]+$/.test(u.pathname) && !u.pathname.endsWith(roomId))
    const forkId = page.url().split('/').pop()
    await page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()
    await page.locator('button.file[data-path="plan.md"]').click()
    await waitFor(async () => (await editorText(page)) === 'step one', 10_000, 'the fork lacks the file')
    await page.keyboard.press('Alt+4')
    await page.getByTestId('parentage').filter({ hasText: `room ${roomId.slice(0, 8)}` }).waitFor()
    await shot(page, '17-fork-parentage')
    const fork = await api(server, token, 'GET', `/api/rooms/${forkId}`)
    assert.equal(fork.body.parent.room, roomId)
    assert.deepEqual(ana.errors, [])
    assert.deepEqual(await server.stop(), { code: 0, signal: null })
  })

test('a secret is added from the page and never shown again', { skip, timeout: 120_000 }, async (t) => {
  const { storage, server, people: [ana] } = await scene(t, ['ana@example.com'])
  const { page } = ana
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'with a secret')
  const token = await mintToken(storage, 'ana@example.com')
  const value = `sk-page-${Date.now()}-${Math.random().toString(36).slice(2)}`
  // Alt+5 opens the Secrets panel.
  await page.keyboard.press('Alt+5')
  await page.getByTestId('secret-name').fill('MODEL_KEY')
  await page.getByTestId('secret-value').fill(value)
  await page.getByTestId('secret-hosts').fill('api.models.example, *.models.example')
  await page.getByTestId('secret-add').click()
  const item = page.getByTestId('secret').filter({ hasText: 'MODEL_KEY' })
  await item.waitFor()
  assert.match(await item.innerText(), /api\.models\.example/)
  assert.match(await item.innerText(), /Authorization: Bearer •••/)
  // Nowhere on the page, in no field, and not in what the server answers.
  const html = await page.content()
  const fields = await page.evaluate(() => Array.from(document.querySelectorAll('input')).map((i) => i.value))
  assert.ok(!html.includes(value) && !fields.includes(value), 'the page still holds the value')
  const listed = await api(server, token, 'GET', `/api/rooms/${roomId}/secrets`)
  assert.equal(listed.status, 200)
  assert.ok(!JSON.stringify(listed.body).includes(value))
  assert.deepEqual(listed.body.map((s) => s.name), ['MODEL_KEY'])
  await shot(page, '18-secrets')
  await item.getByRole('button', { name: 'Delete' }).click()
  await page.getByText('No secrets.').waitFor()
  assert.deepEqual(ana.errors, [])
  assert.deepEqual(await server.stop(), { code: 0, signal: null })
})

test('the Network panel opens a host, switches a registry on, and offers to allow a refused host',
  { skip, timeout: 120_000 }, async (t) => {
    const { storage, server, people: [ana] } = await scene(t, ['ana@example.com'])
    const { page } = ana
    await login(ana, storage.dataDir)
    const roomId = await createRoomFromPage(ana, 'networked')
    const token = await mintToken(storage, 'ana@example.com')
    // Code inside asks for a host nobody allowed (curl reads the proxy from its environment).
    const refused = await api(server, token, 'POST', `/api/rooms/${roomId}/exec`,
      { argv: ['curl', '-sS', '-o', '/dev/null', '-w', '%{http_code}', 'https://api.blocked.example/'], timeout_ms: 30000 })
    assert.equal(refused.status, 200)
    assert.match(refused.body.stderr, /403/)
    // Alt+6 opens the Network panel: nothing allowed, the refusal listed with its reason.
    await page.keyboard.press('Alt+6')
    await page.getByText('Nothing is allowed').waitFor()
    const denied = page.getByTestId('egress-denied').filter({ hasText: 'api.blocked.example:443' })
    await denied.waitFor()
    assert.match(await denied.innerText(), /not on the room's egress allowlist/)
    await shot(page, '19-network')
    // One click allows it; typing a rule allows another; a preset is a checkbox.
    await page.getByTestId('egress-allow-api.blocked.example').click()
    await page.getByTestId('egress-allowed').filter({ hasText: 'api.blocked.example' }).waitFor()
    await page.getByTestId('egress-rule').fill('*.Models.example')
    await page.getByTestId('egress-add').click()
    await page.getByTestId('egress-allowed').filter({ hasText: '*.models.example' }).waitFor()
    await page.getByTestId('egress-preset-npm').check()
    await waitFor(async () => (await api(server, token, 'GET', `/api/rooms/${roomId}/egress`)).body?.presets?.includes('npm'),
      10_000, 'the preset never reached the server')
    const eg = await api(server, token, 'GET', `/api/rooms/${roomId}/egress`)
    assert.deepEqual(eg.body.allow, ['api.blocked.example', '*.models.example'])
    // Two rules added one at a time (an owner's allow is immediate), one preset switched on.
    const changes = (await api(server, token, 'GET', `/api/rooms/${roomId}/audit`)).body
    assert.equal(changes.filter((r) => r.action === 'allow_egress' && r.decision === 'allow').length, 2)
    assert.equal(changes.filter((r) => r.action === 'set_egress').length, 1)
    await page.getByTestId('egress-remove-*.models.example').click()
    await waitFor(async () => (await api(server, token, 'GET', `/api/rooms/${roomId}/egress`)).body?.allow?.length === 1,
      10_000, 'the rule was never removed')
    assert.deepEqual(ana.errors, [])
    assert.deepEqual(await server.stop(), { code: 0, signal: null })
  })
