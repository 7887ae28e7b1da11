// Logging in as people do (issue 19, item 8): the code pasted with a space in it works, and
// "Send a new code" counts down the server's one-code-a-minute before it can be used, then sends
// a fresh code that logs in.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { skipUnless, waitFor } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, codeFor, shot } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('a pasted code with a space logs in; a new code can be asked for once the countdown ends', { skip, timeout: 180_000 }, async (t) => {
  const { storage, people: [ana] } = await scene(t, ['ana@example.com'])
  const page = ana.page
  const started = Date.now() - 1000
  await page.goto('/')
  await page.getByLabel('Email').fill(ana.email)
  await page.getByRole('button', { name: 'Send me a code' }).click()
  await page.getByLabel('Code').waitFor()

  // The resend button waits, and says how long.
  const resend = page.getByTestId('resend-code')
  assert.equal(await resend.isDisabled(), true)
  const first = await resend.textContent()
  assert.match(first, /^Send a new code \(in \d+ s\)$/)
  await waitFor(async () => (await resend.textContent()) !== first, 5_000, 'the countdown does not move')
  await shot(page, '41-login-resend-countdown')

  // Once it ends, a new code is sent; the newest one is the one to use.
  const firstCode = await codeFor(storage.dataDir, ana.email, started)
  await waitFor(async () => !(await resend.isDisabled()), 75_000, 'the resend button never came back')
  const resent = Date.now()
  await resend.click()
  await page.getByTestId('code-sent').filter({ hasText: 'A new code is on its way' }).waitFor({ timeout: 10_000 }).catch(async (e) => { throw new Error(`${e.message}: ${await page.locator('.error').allTextContents()}`) })
  assert.equal(await resend.isDisabled(), true, 'the countdown starts again')
  let code = null
  await waitFor(async () => {
    code = await codeFor(storage.dataDir, ana.email, resent - 500)
    return code !== null
  }, 15_000, 'no new code was mailed')
  assert.equal(typeof firstCode, 'string')

  // Pasted with a space in the middle: the field keeps all of it, and it logs in.
  await page.getByLabel('Code').focus()
  await page.keyboard.insertText(`${code.slice(0, 3)} ${code.slice(3)}`)
  assert.equal(await page.getByLabel('Code').inputValue(), `${code.slice(0, 3)} ${code.slice(3)}`)
  await page.getByRole('button', { name: 'Log in' }).click()
  await page.getByTestId('me').filter({ hasText: ana.email }).waitFor({ state: 'attached' })
})
