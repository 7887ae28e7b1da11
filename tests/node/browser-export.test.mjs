// Downloading the workspace (issue 19, item 7): Ben, who holds `export`, asks from the Room
// panel; Ana approves in her Approvals panel; Ben's Approvals panel then offers the download,
// and what the browser saves is a .tar.gz that GNU tar unpacks into the room's files, the
// binary the terminal made and the text the editor shows.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { skipUnless, waitFor, mintToken, openProvider, waitSynced, destroyAll, Y, joinByInvite, api } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, openPanel } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('the workspace downloads as a .tar.gz once someone else approves', { skip, timeout: 180_000 }, async (t) => {
  const { defer, storage, server, people: [ana, ben] } = await scene(t, ['ana@example.com', 'ben@example.com'])
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'take away')
  const anaToken = await mintToken(storage, 'ana@example.com')
  const { token: benToken, id: benId } = await joinByInvite(server, storage, roomId, anaToken, 'ben@example.com')
  assert.equal((await api(server, anaToken, 'PATCH', `/api/rooms/${roomId}/participants/${benId}`, { grant: ['export'] })).status, 200)
  const c = openProvider(server, roomId, anaToken)
  defer(() => destroyAll([c]))
  await waitSynced(c.provider)
  c.doc.getMap('files').set('src/app.py', new Y.Text('print("take away")\n'))
  await waitFor(async () => {
    const r = await api(server, benToken, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['sh', '-c', 'cat src/app.py && printf "\\001\\002" > build.bin'] })
    return r.status === 200 && r.body.stdout.includes('take away')
  }, 20_000, 'the file did not reach the workspace')

  // Ben asks from the Room panel.
  await login(ben, storage.dataDir, `/rooms/${roomId}`)
  const page = ben.page
  await page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()
  await openPanel(page, 'Room')
  await page.getByTestId('export-workspace').click()
  await page.getByTestId('export-state').filter({ hasText: 'Waiting for approval' }).waitFor()

  // Ana approves.
  await openPanel(ana.page, 'Approvals')
  await ana.page.locator('[data-testid^="approve-"]').first().click()
  await ana.page.getByText('Nothing waits for a decision.').waitFor()

  // Ben downloads it from his Approvals panel.
  await openPanel(page, 'Approvals')
  const use = page.locator('[data-testid^="use-"]', { hasText: 'Download the workspace' })
  await waitFor(async () => {
    if (await use.count() > 0) return true
    await page.getByRole('button', { name: 'Refresh' }).first().click()
    return false
  }, 20_000, 'the approved download was not offered')
  const downloading = page.waitForEvent('download')
  await use.first().click()
  const saved = await downloading
  assert.equal(saved.suggestedFilename(), 'take away.tar.gz')
  const dir = mkdtempSync(join(tmpdir(), 'coderoom-export-'))
  defer(() => rmSync(dir, { recursive: true, force: true }))
  execFileSync('tar', ['-xzf', await saved.path(), '-C', dir])
  assert.equal(readFileSync(join(dir, 'src/app.py'), 'utf8'), 'print("take away")\n')
  assert.deepEqual([...readFileSync(join(dir, 'build.bin'))], [1, 2])

  // Spent: the download is no longer offered, and the audit log says what happened.
  await page.getByRole('button', { name: 'Refresh' }).first().click()
  await waitFor(async () => await use.count() === 0, 10_000, 'a spent approval is still offered')
  await openPanel(page, 'Audit')
  await page.getByText(/ben@example\.com downloaded the workspace \(\d/).first().waitFor()
})
