// Run and Stop in a real browser: the room's run command is guessed from its files (a lone
// main.py), run in the shared terminal by the Run button, set with Edit (saved in the room's
// coderoom.toml, where every client sees it), stopped with Stop (Ctrl-C), and run again with
// Ctrl+Enter from the editor, which gives the key up (no line is inserted).

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { skipUnless, waitFor, mintToken, api, openProvider, waitSynced, destroyAll, serverFiles, Y } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot, shotsAll, terminalText } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('Run types the room\'s command into the shared terminal, Stop interrupts it, Ctrl+Enter runs it', { skip, timeout: 180_000 }, async (t) => {
  const { defer, storage, server, people: [ana] } = await scene(t, ['ana@example.com'])
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'run it')
  const token = await mintToken(storage, 'ana@example.com')
  const page = ana.page
  await page.getByTestId('terminal-status').filter({ hasText: 'Connected' }).waitFor({ timeout: 30_000 })

  // Alone in the room, Ana is shown online (issue 19, item 10).
  await page.getByTestId('person-ana@example.com').locator('.dot.on').waitFor({ timeout: 10_000 })

  // Nothing to run yet.
  await page.getByTestId('run-command').filter({ hasText: 'no run command' }).waitFor()
  assert.equal(await page.getByTestId('run').isDisabled(), true)

  // A lone main.py, written by another client: the command is guessed, and Run runs it.
  const c = openProvider(server, roomId, token)
  defer(() => destroyAll([c]))
  await waitSynced(c.provider)
  const program = 'print("hello-from-" + str(6 * 7))\n'
  c.doc.getMap('files').set('main.py', new Y.Text(program))
  await page.getByTestId('run-command').filter({ hasText: 'python3 main.py' }).waitFor()
  assert.equal(await page.getByTestId('run-command').getAttribute('title'), 'guessed from main.py')
  // Run waits for the document to be quiet (the sandbox writes files 150 ms after an edit);
  // on a loaded machine the write can take longer, so the test waits for the file on disk.
  await waitFor(async () => {
    const r = await api(server, token, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['cat', 'main.py'] })
    return r.status === 200 && r.body.stdout === program
  }, 20_000, 'main.py did not reach the workspace')
  await page.getByTestId('run').click()
  await waitFor(async () => (await terminalText(page)).includes('hello-from-42'), 20_000, 'Run did not run main.py').catch(async (e) => { throw new Error(`${e.message}: ${await terminalText(page)}`) })

  // Edit sets the command, saved in coderoom.toml for everyone.
  await page.getByTestId('run-edit').click()
  await page.getByTestId('run-input').fill('sleep 30; echo not-interrupted')
  await page.getByTestId('run-input').press('Enter')
  await page.getByTestId('run-command').filter({ hasText: 'sleep 30; echo not-interrupted' }).waitFor()
  await waitFor(async () => c.doc.getMap('files').get('coderoom.toml')?.toString() === 'run = "sleep 30; echo not-interrupted"\n',
    10_000, 'coderoom.toml did not reach another client')
  await shotsAll(page, '40-run-command')

  // Run, then Stop: Ctrl-C ends the whole line, so the next command runs at once and the
  // rest of the interrupted line never does.
  await page.getByTestId('run').click()
  await waitFor(async () => /sleep 30; echo not-interrupted\s/.test(await terminalText(page)), 20_000, 'the command was not typed')
  await page.getByTestId('run-stop').click()
  await page.getByTestId('terminal').click()
  await page.keyboard.type('echo after-$((1+1))\n', { delay: 10 })
  await waitFor(async () => (await terminalText(page)).includes('after-2'), 20_000, 'the shell did not come back after Stop')
  assert.doesNotMatch(await terminalText(page), /^not-interrupted/m, 'Stop did not interrupt the command')

  // Ctrl+Enter in the editor runs the room's command; the editor does not take the key.
  await page.getByTestId('run-edit').click()
  await page.getByTestId('run-input').fill('echo ran-$((40+2))')
  await page.getByTestId('run-input').press('Enter')
  await page.getByTestId('run-command').filter({ hasText: 'echo ran-$((40+2))' }).waitFor()
  await page.getByText('main.py', { exact: true }).first().click()
  await page.locator('.cm-content').click()
  await page.keyboard.press('Control+Enter')
  await waitFor(async () => (await terminalText(page)).includes('ran-42'), 20_000, 'Ctrl+Enter did not run the command')
  const files = await serverFiles(server, roomId, token)
  assert.equal(files['main.py'], program, 'Ctrl+Enter changed the file')

  // What ran is recorded as Ana's keys, like anything typed.
  const inputs = await api(server, token, 'GET', `/api/rooms/${roomId}/terminal/recording/inputs`)
  assert.equal(inputs.status, 200)
  const typed = String(inputs.body).split('\n').filter(Boolean).map((l) => JSON.parse(l).data).join('')
  assert.match(typed, /python3 main\.py\r/)
  assert.match(typed, /\x03/)
  assert.match(typed, /echo ran-\$\(\(40\+2\)\)\r/)
})
