// The E2B door seen from the room, in Chromium: a harness on the stock npm SDK (`e2b`) writes a
// file and it is in the editor of the person watching, with what they type there being what
// the SDK reads back; an agent in approval mode runs `commands.run`, the call waits, and it
// runs once the owner approves exactly that command in the room's Approvals panel.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { api, mintToken, waitFor, skipUnless } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot, editorText, openPanel } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

/** Points the SDK at `server` as `key`, for the test's length. */
function harnessEnv (defer, server, key) {
  const saved = { ...process.env }
  defer(() => {
    for (const k of ['E2B_API_KEY', 'E2B_API_URL', 'E2B_SANDBOX_URL']) {
      if (saved[k] === undefined) delete process.env[k]; else process.env[k] = saved[k]
    }
  })
  process.env.E2B_API_KEY = key
  process.env.E2B_API_URL = `${server.url}/api/e2b`
  process.env.E2B_SANDBOX_URL = `${server.url}/api/e2b/envd`
}

test('what an E2B harness writes is in the room\'s editor, and its command waits for the owner\'s approval in the browser',
  { skip, timeout: 240_000 }, async (t) => {
    const s = await scene(t, ['ana@example.com'])
    const { storage, server, defer, people: [ana] } = s
    const { page } = ana
    await login(ana, storage.dataDir)
    const roomId = await createRoomFromPage(ana, 'harnessed')
    const token = await mintToken(storage, 'ana@example.com')

    // A harness with an agent's key: the file it writes opens in Ana's editor.
    const helper = await api(server, token, 'POST', `/api/rooms/${roomId}/agents`,
      { name: 'helper', capabilities: ['observe', 'edit', 'type'], ttl_s: 3600 })
    assert.equal(helper.status, 201, JSON.stringify(helper.body))
    harnessEnv(defer, server, helper.body.token)
    const sbx = await Sandbox.create()
    await sbx.files.write('/home/user/report.py', 'print("from the harness")\n')
    const file = page.locator('button.file[data-path="report.py"]')
    await file.waitFor({ timeout: 10_000 })
    await file.click()
    await waitFor(async () => (await editorText(page)) === 'print("from the harness")\n', 10_000,
      async () => `the editor shows ${JSON.stringify(await editorText(page))}`)
    // What Ana types is what the SDK reads.
    await page.locator('.cm-content').click()
    await page.keyboard.press('Control+End')
    await page.keyboard.type('# reviewed by ana')
    await waitFor(async () => (await sbx.files.read('/home/user/report.py')).includes('# reviewed by ana'), 10_000,
      'the SDK never read what Ana typed')
    await shot(page, 'e2b-file-in-editor')

    // An agent in approval mode: its command waits for Ana, who approves it in the room.
    const careful = await api(server, token, 'POST', `/api/rooms/${roomId}/agents`,
      { name: 'careful', capabilities: ['observe', 'edit', 'type'], ttl_s: 3600, approval_mode: true })
    assert.equal(careful.status, 201, JSON.stringify(careful.body))
    process.env.E2B_API_KEY = careful.body.token
    const cautious = await Sandbox.create()
    let settled = false
    const ran = cautious.commands.run('echo approved-and-ran', { timeoutMs: 120_000 })
      .finally(() => { settled = true })
    await openPanel(page, 'Approvals')
    const approve = page.locator('[data-testid^="approve-"]').first()
    await approve.waitFor({ timeout: 20_000 })
    // The card shows exactly the command the SDK asked to run; nothing ran meanwhile.
    await page.locator('pre.params', { hasText: 'echo approved-and-ran' }).waitFor()
    assert.equal(settled, false, 'the command did not wait for the approval')
    await shot(page, 'e2b-approval-in-room')
    await approve.click()
    const r = await ran
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'approved-and-ran\n')
    assert.deepEqual(ana.errors, [])
  })
