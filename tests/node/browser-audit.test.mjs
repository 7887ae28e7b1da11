// The audit log as a team reads it (issue 41, item 3): an agent's acts are sentences naming it
// and who brought it in, never its made-up address; the server's metered records fold into one
// line; filters by who, what and when; the chain check stays; the log downloads as JSON Lines.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFile } from 'node:fs/promises'
import { api, mintToken, skipUnless, waitFor } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shotsAll, openPanel } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('the audit log names agents and their sponsors, folds metering, filters and exports', { skip, timeout: 240_000 }, async (t) => {
  const s = await scene(t, ['ana@example.com'], { extraArgs: ['--spend-flush-ms', '300'] })
  const { storage, server, people: [ana] } = s
  const { page } = ana
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'audited')
  const anaToken = await mintToken(storage, 'ana@example.com')
  const made = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/agents`,
    { name: 'helper-bot', capabilities: ['observe', 'edit', 'type'], ttl_s: 3600 })
  assert.equal(made.status, 201, JSON.stringify(made.body))
  for (const argv of [['python3', '-c', 'print(6 * 7)'], ['true']]) {
    const ran = await api(server, made.body.token, 'POST', `/api/rooms/${roomId}/exec`, { argv })
    assert.equal(ran.status, 200, JSON.stringify(ran.body))
  }
  // The room's metering is written down a few times meanwhile.
  let records = []
  await waitFor(async () => {
    records = (await api(server, anaToken, 'GET', `/api/rooms/${roomId}/audit`)).body
    // A run of them at the end (the sandbox's seconds go on adding up).
    return records.length >= 3 && records.slice(-3).every((r) => r.action === 'metered')
  }, 20_000, 'no run of metered records', 200)

  await openPanel(page, 'Audit')
  await page.getByTestId('audit-chain').filter({ hasText: 'Chain verified' }).waitFor()
  const log = page.locator('ol.audit')
  await log.getByText('helper-bot (an agent brought in by ana@example.com) ran python3.').waitFor()
  assert.equal(await log.getByText('@agents.invalid').count(), 0, 'an agent shown by its made-up address')
  // Metering: runs of records, one line each (fewer lines than records).
  const meteredRecords = records.filter((r) => r.action === 'metered').length
  const meteredLines = await page.getByTestId('audit-metered').count()
  assert.ok(meteredLines >= 1 && meteredLines < meteredRecords, `${meteredLines} lines for ${meteredRecords} metered records`)
  await shotsAll(page, '63-audit-in-words')

  // Filters: the agent's acts alone, then its commands alone.
  await page.getByTestId('audit-who').selectOption('helper-bot (an agent brought in by ana@example.com)')
  await page.getByTestId('audit-filtered').waitFor()
  const sentences = await log.locator('.audit-sentence').allInnerTexts()
  assert.ok(sentences.length >= 2 && sentences.every((x) => x.startsWith('helper-bot')), JSON.stringify(sentences))
  await page.getByTestId('audit-what').selectOption('run_command')
  await waitFor(async () => (await log.locator('.audit-sentence').allInnerTexts()).length === 2, 5000, 'the two commands alone')
  await page.getByTestId('audit-what').selectOption('')
  await page.getByTestId('audit-who').selectOption('')

  // JSON Lines: every record the page verified, one a line.
  const [download] = await Promise.all([page.waitForEvent('download'), page.getByTestId('audit-export').click()])
  const lines = (await readFile(await download.path(), 'utf8')).trimEnd().split('\n').map((l) => JSON.parse(l))
  const shownCount = Number((await page.getByTestId('audit-chain').innerText()).match(/(\d+) records/)[1])
  assert.equal(lines.length, shownCount)
  assert.deepEqual(lines.map((r) => r.seq), [...lines.map((r) => r.seq)].sort((a, b) => a - b))
  assert.deepEqual(ana.errors, [])
})
