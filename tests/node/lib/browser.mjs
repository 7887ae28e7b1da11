// Real headless Chromium (Debian's `chromium`) driven by playwright-core, for the browser
// end-to-end tests.

import { chromium } from 'playwright-core'
import { existsSync } from 'node:fs'
import { mkdir, readdir, readFile, stat, writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { cleanups, createStorage, startServer, waitFor } from './server.mjs'

export const CHROMIUM = process.env.CODEROOM_CHROMIUM || '/usr/bin/chromium'
export const HAVE_CHROMIUM = existsSync(CHROMIUM)
/** Where the runs' screenshots go, for a reviewer to look at. */
export const SCREENSHOTS = process.env.CODEROOM_SCREENSHOTS ||
  fileURLToPath(new URL('../../../target/screenshots/', import.meta.url))

export async function launch () {
  await mkdir(SCREENSHOTS, { recursive: true })
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-background-networking',
      '--disable-component-update', '--no-first-run', '--disable-sync', '--disable-features=Translate,MediaRouter']
  })
}

/**
 * A browser context for one person, recording every request that leaves the app's origin and
 * every page error, so tests can assert there were none.
 */
export async function person (browser, server, email, viewport = { width: 1280, height: 800 }) {
  const context = await browser.newContext({ viewport, baseURL: server.url })
  const page = await context.newPage()
  const foreign = []
  const errors = []
  const origin = new URL(server.url)
  page.on('request', (r) => {
    const u = new URL(r.url())
    if (u.protocol === 'data:' || u.protocol === 'blob:') return
    if (u.host !== origin.host) foreign.push(r.url())
  })
  page.on('websocket', (ws) => {
    if (new URL(ws.url()).host !== origin.host) foreign.push(ws.url())
  })
  page.on('pageerror', (e) => errors.push(String(e)))
  // The page's API calls, timed, for the failure report `scene` writes.
  const calls = []
  const began = new Map()
  const done = (r, how) => {
    const t0 = began.get(r)
    if (t0 === undefined) return
    began.delete(r)
    calls.push(`${new Date(t0).toISOString()} +${Date.now() - t0}ms ${r.method()} ${new URL(r.url()).pathname} ${how}`)
    if (calls.length > 400) calls.splice(0, 200)
  }
  page.on('request', (r) => { if (new URL(r.url()).pathname.startsWith('/api/')) began.set(r, Date.now()) })
  page.on('requestfinished', async (r) => done(r, String((await r.response().catch(() => null))?.status() ?? '?')))
  page.on('requestfailed', (r) => done(r, `failed: ${r.failure()?.errorText}`))
  const pending = () => [...began].map(([r, t0]) => `${new Date(t0).toISOString()} (still waiting) ${r.method()} ${new URL(r.url()).pathname}`)
  return { email, context, page, foreign, errors, calls, pending }
}

/** The newest login code mailed to `email` in the dev outbox. */
export async function codeFor (dataDir, email, after = 0) {
  const dir = join(dataDir, 'outbox')
  let code = null
  await waitFor(async () => {
    let names = []
    try { names = await readdir(dir) } catch { return false }
    let best = null
    for (const n of names.filter((n) => n.endsWith('.eml'))) {
      const p = join(dir, n)
      const s = await stat(p)
      if (s.mtimeMs < after) continue
      const text = await readFile(p, 'utf8')
      if (!new RegExp(`^To: .*${email.replace(/[.@]/g, '\\$&')}`, 'mi').test(text)) continue
      const m = text.match(/login code is (\d{6})/)
      if (m && (!best || s.mtimeMs >= best.t)) best = { t: s.mtimeMs, code: m[1] }
    }
    code = best?.code ?? null
    return code !== null
  }, 15_000, `no login code mailed to ${email}`, 100)
  return code
}

/** Logs in through the login page with a code read from the dev outbox. */
export async function login (p, dataDir, next = '/') {
  const { page, email } = p
  const started = Date.now() - 1000
  await page.goto(next)
  await page.getByLabel('Email').fill(email)
  await page.getByRole('button', { name: 'Send me a code' }).click()
  await page.getByLabel('Code').waitFor()
  const code = await codeFor(dataDir, email, started)
  await page.getByLabel('Code').fill(code)
  await page.getByRole('button', { name: 'Log in' }).click()
  await page.getByTestId('me').filter({ hasText: email }).waitFor({ state: 'attached' })
}

export async function shot (page, name) {
  const path = join(SCREENSHOTS, `${name}.png`)
  await page.screenshot({ path, fullPage: false })
  return path
}

/**
 * `name` as it looks light and dark, 1280 and 420 px wide (`NAME.png` as the page is, then
 * `NAME-dark`, `NAME-dark-420`, `NAME-420`); the page gets its theme and size back after.
 */
export async function shotsAll (page, name) {
  const size = page.viewportSize()
  const theme = await page.evaluate(() => document.documentElement.dataset.theme ?? 'light')
  const setTheme = (t) => page.evaluate((t) => { document.documentElement.dataset.theme = t }, t)
  await shot(page, name)
  await setTheme('dark')
  await shot(page, `${name}-dark`)
  await page.setViewportSize({ width: 420, height: size.height })
  await shot(page, `${name}-dark-420`)
  await setTheme('light')
  await shot(page, `${name}-420`)
  await page.setViewportSize(size)
  await setTheme(theme)
}

/** Text of the open editor (CodeMirror's document, line by line). */
export async function editorText (page) {
  return page.locator('.cm-content').evaluate((el) =>
    Array.from(el.querySelectorAll('.cm-line')).map((l) => l.textContent).join('\n'))
}

/** Everything the terminal shows (xterm's DOM renderer rows). */
export async function terminalText (page) {
  return page.locator('.xterm-rows').evaluate((el) => el.innerText)
}

/** A server on fresh storage, a browser, and one browser context per email, all torn down
 *  with the test. */
export async function scene (t, emails, serverOpts = {}) {
  const defer = cleanups(t)
  const storage = await createStorage('sqlite')
  defer(() => storage.cleanup())
  const server = await startServer(storage, serverOpts)
  defer(() => server.kill())
  const browser = await launch()
  defer(() => browser.close())
  const people = []
  for (const email of emails) people.push(await person(browser, server, email))
  // What a failure needs to be understood: the pages' API calls and the server's log.
  defer(() => report(t, server, people))
  return { defer, storage, server, browser, people }
}

/** Writes `target/test-reports/pages/NAME.log`: each person's timed API calls and the
 *  server's log tail (the test's last moments, for a failure that does not reproduce alone). */
async function report (t, server, people) {
  const dir = fileURLToPath(new URL('../../../target/test-reports/pages/', import.meta.url))
  await mkdir(dir, { recursive: true })
  const parts = people.map((p) => `== ${p.email}\n${[...p.calls, ...p.pending()].join('\n')}`)
  parts.push(`== server log\n${server.logs(100_000)}`)
  await writeFile(join(dir, `${t.name.replace(/[^A-Za-z0-9]+/g, '-').slice(0, 80)}.log`), parts.join('\n\n'))
}

/** Creates a room from the room list; returns its id once the room page has synced. */
export async function createRoomFromPage (p, name) {
  await p.page.getByLabel('Room name').fill(name)
  await p.page.getByRole('button', { name: 'Create room' }).click()
  await p.page.waitForURL(/\/rooms\/[A-Za-z0-9_-]+$/)
  await p.page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()
  return p.page.url().split('/').pop()
}

/** Opens side panel `name` (its group first, when another group is shown). */
export async function openPanel (page, name) {
  const tab = page.getByRole('tab', { name: new RegExp(`^${name}\\b`) })
  if (await tab.count() === 0) await page.locator(`[data-group-panels~="${name}"]`).click()
  await tab.click()
}

/** Serious and critical axe-core violations on `page` as it is, one line each. axe is run
 *  through the DevTools protocol, which the page's CSP does not govern. */
export async function axeViolations (page) {
  const { createRequire } = await import('node:module')
  const source = await readFile(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8')
  await page.evaluate(source)
  return page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { resultTypes: ['violations'] })
    return r.violations
      .filter((v) => v.impact === 'serious' || v.impact === 'critical')
      .map((v) => `${v.impact} ${v.id}: ${v.help} (${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join('; ')})`)
  })
}
