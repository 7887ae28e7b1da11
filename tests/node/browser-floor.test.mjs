// Terminal floor control in real browsers: Ana takes control of the shared terminal; Ben's keys
// never reach the shell while she has it (he is told who has it), he asks for control from his
// page, she hands it over from hers, and from then on only his keys reach it.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { skipUnless, waitFor, mintToken, api, joinByInvite } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot, terminalText } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('one driver at a time: only the holder types, and control is handed over on request', { skip, timeout: 180_000 }, async (t) => {
  const { storage, server, people: [ana, ben] } = await scene(t, ['ana@example.com', 'ben@example.com'])
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'one driver')
  const anaToken = await mintToken(storage, 'ana@example.com')
  await joinByInvite(server, storage, roomId, anaToken, 'ben@example.com')
  await login(ben, storage.dataDir, `/rooms/${roomId}`)
  // Ana's People panel shows him without a reload.
  await ana.page.getByTestId('person-ben@example.com').waitFor({ timeout: 10_000 })
  for (const p of [ana, ben]) {
    await p.page.getByTestId('terminal-status').filter({ hasText: 'Connected' }).waitFor({ timeout: 30_000 })
  }

  // Ana takes control: both pages say who has it.
  await ana.page.getByTestId('floor-take').click()
  await ana.page.getByTestId('floor-holder').filter({ hasText: 'You have control' }).waitFor()
  await ben.page.getByTestId('floor-holder').filter({ hasText: 'ana@example.com has control' }).waitFor()

  // Ben types: refused, told why, and nothing of it runs. Ana's keys run.
  await ben.page.getByTestId('terminal').click()
  await ben.page.keyboard.type('echo ben-early-$((1+1))\n', { delay: 10 })
  await ben.page.getByTestId('terminal-status').filter({ hasText: 'ana@example.com has the terminal' }).waitFor()
  await ana.page.getByTestId('terminal').click()
  await ana.page.keyboard.type('echo ana-drives-$((2+2))\n', { delay: 10 })
  await waitFor(async () => (await terminalText(ben.page)).includes('ana-drives-4'), 20_000, 'Ben did not see Ana\'s command run')
  assert.doesNotMatch(await terminalText(ana.page), /ben-early/, 'a refused key reached the shell')

  // Ben asks for control; Ana sees the request and hands over.
  await ben.page.getByTestId('floor-request-button').click()
  await ben.page.getByTestId('floor-asked').waitFor()
  const request = ana.page.getByTestId('floor-request').filter({ hasText: 'ben@example.com asks for control' })
  await request.waitFor()
  await shot(ana.page, '24-terminal-control-request')
  await request.getByTestId('floor-give').click()
  await ben.page.getByTestId('floor-holder').filter({ hasText: 'You have control' }).waitFor()
  await ana.page.getByTestId('floor-holder').filter({ hasText: 'ben@example.com has control' }).waitFor()

  // Now Ben's keys run and Ana's are refused.
  await ben.page.getByTestId('terminal').click()
  await ben.page.keyboard.type('echo ben-drives-$((3+3))\n', { delay: 10 })
  await waitFor(async () => (await terminalText(ana.page)).includes('ben-drives-6'), 20_000, 'Ana did not see Ben\'s command run')
  await ana.page.getByTestId('terminal').click()
  await ana.page.keyboard.type('echo ana-late-$((4+4))\n', { delay: 10 })
  await ana.page.getByTestId('terminal-status').filter({ hasText: 'ben@example.com has the terminal' }).waitFor()
  // A marker typed by the holder after Ana's attempt: had her line run, its output would be above it.
  await ben.page.keyboard.type('echo marker-$((5+5))\n', { delay: 10 })
  await waitFor(async () => (await terminalText(ana.page)).includes('marker-10'), 20_000, 'the marker did not run')
  assert.doesNotMatch(await terminalText(ana.page), /ana-late-8/, 'a refused key reached the shell')

  // Released: free for anyone's next line, and Ana's bar no longer says Ben has it.
  await ben.page.getByTestId('floor-release').click()
  await ana.page.getByTestId('floor-take').waitFor()
  await waitFor(async () => !(await ana.page.getByTestId('terminal-status').innerText()).includes('ben@example.com'), 5000,
    async () => `Ana's terminal bar still reads ${JSON.stringify(await ana.page.getByTestId('terminal-status').innerText())}`)
  await ana.page.getByTestId('terminal').click()
  await ana.page.keyboard.type('echo ana-again-$((6+6))\n', { delay: 10 })
  await waitFor(async () => (await terminalText(ben.page)).includes('ana-again-12'), 20_000, 'Ana could not type after the release')

  // The recording says who typed what reached the shell, and holds nothing refused.
  const inputs = await api(server, anaToken, 'GET', `/api/rooms/${roomId}/terminal/recording/inputs`)
  assert.equal(inputs.status, 200)
  const lines = String(inputs.body).split('\n').filter(Boolean).map((l) => JSON.parse(l))
  const room = (await api(server, anaToken, 'GET', `/api/rooms/${roomId}`)).body
  const idOf = (email) => room.participants.find((p) => p.email === email).user_id
  const typed = (email) => lines.filter((e) => e.user === idOf(email)).map((e) => e.data).join('')
  assert.match(typed('ana@example.com'), /echo ana-drives-\$\(\(2\+2\)\)\r[\s\S]*echo ana-again/)
  assert.match(typed('ben@example.com'), /echo ben-drives-\$\(\(3\+3\)\)\r/)
  assert.doesNotMatch(typed('ben@example.com'), /ben-early/)
  assert.doesNotMatch(typed('ana@example.com'), /ana-late/)
  assert.deepEqual(ana.errors, [])
  assert.deepEqual(ben.errors, [])
  assert.deepEqual(await server.stop(), { code: 0, signal: null })
})
