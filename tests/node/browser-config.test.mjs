// A room open across a restart with another configuration (issue 41, item 5): the server comes
// back with previews turned on and Ana made an admin; her page says what changed and offers a
// reload, after which it offers previews and the admin console, as a fresh page would.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { startServer, freePort, skipUnless } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shotsAll, openPanel, axeViolations } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('a room open across a restart with another configuration says so and reloads into it', { skip, timeout: 180_000 }, async (t) => {
  const listen = `127.0.0.1:${await freePort()}`
  const s = await scene(t, ['ana@example.com'], { listen })
  const { storage, people: [ana] } = s
  const { page } = ana
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'reconfigured')
  await openPanel(page, 'Previews')
  await page.getByTestId('previews-off').waitFor()
  assert.equal(await page.getByTestId('admin-link').count(), 0)
  assert.equal(await page.getByTestId('config-changed').isVisible(), false)

  // Back on the same address, with previews and Ana among the admins.
  assert.deepEqual(await s.server.stop(), { code: 0, signal: null })
  const previewPort = await freePort()
  const server = await startServer(storage, {
    listen,
    extraArgs: ['--preview-url', `http://{id}.preview.localhost:${previewPort}`, '--preview-listen', `127.0.0.1:${previewPort}`,
      '--admin-emails', 'ana@example.com']
  })
  s.defer(() => server.kill())
  const told = page.getByTestId('config-changed')
  await told.filter({ hasText: 'previews are on now' }).waitFor({ timeout: 30_000 })
  await told.filter({ hasText: 'you are an admin now' }).waitFor({ timeout: 30_000 })
  await shotsAll(page, '66-config-changed')
  assert.deepEqual(await axeViolations(page), [], 'the notice (light)')
  await page.getByTestId('config-reload').click()
  await page.waitForURL(new RegExp(`/rooms/${roomId}$`))
  await page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()
  await page.getByTestId('admin-link').waitFor()
  await openPanel(page, 'Previews')
  await page.getByTestId('preview-create').waitFor()
  assert.equal(await page.getByTestId('previews-off').count(), 0)
  assert.equal(await page.getByTestId('config-changed').isVisible(), false)
  assert.deepEqual(ana.errors, [])
})
