// Previews in a real browser: an app started from the room's terminal (a page that opens a
// WebSocket to its own server and shows the echo) is offered as a preview when its port opens,
// shown in the room's preview pane on the preview origin (WebSocket included) and in a tab of
// its own; the one-time link never stays in the address nor reaches the app as a Referer, the
// app's session cookie never reaches the preview; a logged-out visitor is sent to log in and a
// non-member gets nothing.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { readFileSync } from 'node:fs'
import { skipUnless, waitFor, mintToken, api, freePort } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

// The app (tests/fixtures/preview_app.py): `/` is a page whose script echoes through `/ws`;
// every request's Cookie and Referer are appended to seen.log in the workspace.
const APP = readFileSync(new URL('../fixtures/preview_app.py', import.meta.url), 'utf8')

/** The status of a GET of `url` on the preview origin (at 127.0.0.1, named by Host: Node does
 *  not resolve `*.localhost` as browsers do). */
function statusOf (url) {
  const u = new URL(url)
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: u.port, path: u.pathname, headers: { host: u.host } }, (res) => {
      res.resume()
      resolve(res.statusCode)
    }).on('error', reject)
  })
}

test('a member previews the room\'s app in the pane and a tab; nobody else can', { skip, timeout: 180_000 }, async (t) => {
  const previewPort = await freePort()
  const { storage, server, browser, people: [ana, ben] } = await scene(t, ['ana@example.com', 'ben@example.com'], {
    extraArgs: ['--preview-url', `http://{id}.preview.localhost:${previewPort}`, '--preview-listen', `127.0.0.1:${previewPort}`]
  })
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'with an app')
  const anaToken = await mintToken(storage, 'ana@example.com')
  const write = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/exec`,
    { argv: ['sh', '-c', `cat > app.py <<'EOF'\n${APP}\nEOF`], timeout_ms: 30000 })
  assert.equal(write.status, 200, JSON.stringify(write.body))

  // Started from the terminal; the room offers the port once it listens.
  await ana.page.getByTestId('terminal').click()
  await ana.page.keyboard.type('python3 app.py\n', { delay: 10 })
  const notice = ana.page.getByTestId('port-notice')
  await notice.filter({ hasText: 'Port 8000 is open' }).waitFor({ timeout: 30_000 })
  await ana.page.getByTestId('port-notice-open').click()

  // The pane: the app on the preview origin, its WebSocket echoing.
  const pane = ana.page.getByTestId('preview-pane')
  await pane.waitFor()
  const frame = ana.page.frameLocator('[data-testid="preview-frame"]')
  await frame.getByText('echo: ping /').waitFor({ timeout: 30_000 })
  const inner = ana.page.frames().find((f) => f.url().includes('.preview.localhost'))
  assert.ok(inner, 'no frame on the preview origin')
  assert.match(inner.url(), new RegExp(`^http://[0-9a-f]{32}\\.preview\\.localhost:${previewPort}/$`))
  // The frame as the room makes it: sandboxed without top navigation, no permissions policy
  // features, no referrer; script in it cannot read the preview's session cookie.
  const frameEl = ana.page.getByTestId('preview-frame')
  assert.equal(await frameEl.getAttribute('sandbox'),
    'allow-scripts allow-same-origin allow-forms allow-popups allow-popups-to-escape-sandbox allow-modals allow-downloads')
  assert.equal(await frameEl.getAttribute('referrerpolicy'), 'no-referrer')
  assert.equal(await frameEl.getAttribute('allow'), null)
  assert.equal(await inner.evaluate(() => document.cookie.includes('coderoom_preview')), false)
  // Beside the editor, not in its place (issue 41, item 7).
  const editorBox = await ana.page.locator('.work > .editor:not([hidden]), .work > .editor-empty:not([hidden])').first().boundingBox()
  const paneBox = await pane.boundingBox()
  assert.ok(editorBox && paneBox && paneBox.x >= editorBox.x + editorBox.width - 2 && editorBox.width > 200,
    `the preview is not beside the editor: ${JSON.stringify({ editorBox, paneBox })}`)
  await shot(ana.page, '21-preview-pane')

  // The Previews panel (Alt+0) lists it; a tab of its own shows the app too.
  await ana.page.keyboard.press('Alt+0')
  const listed = ana.page.getByTestId('preview').filter({ hasText: 'Port 8000' })
  await listed.getByTestId('preview-state').filter({ hasText: 'live' }).waitFor()
  await shot(ana.page, '22-previews-panel')
  const [tab] = await Promise.all([
    ana.context.waitForEvent('page'),
    listed.getByRole('button', { name: 'New tab' }).click()
  ])
  await tab.getByText('echo: ping /').waitFor({ timeout: 30_000 })
  assert.doesNotMatch(tab.url(), /coderoom_preview_token/)
  const previewUrl = tab.url()
  await tab.close()

  // What the app received: no session cookie of the app, no one-time link in any Referer.
  const seen = (await api(server, anaToken, 'POST', `/api/rooms/${roomId}/exec`,
    { argv: ['cat', 'seen.log'], timeout_ms: 30000 })).body.stdout
  assert.match(seen, /^\/ws /m)
  assert.doesNotMatch(seen, /coderoom_session|coderoom_preview/)
  assert.doesNotMatch(seen, /referer=(?!None)/)

  // Logged out: the preview sends its visitor to the room, which asks to log in.
  const stranger = await browser.newContext()
  t.after(() => stranger.close())
  const page = await stranger.newPage()
  await page.goto(previewUrl)
  await page.getByLabel('Email').waitFor()
  assert.equal(new URL(page.url()).searchParams.get('next'), `/rooms/${roomId}`)
  assert.doesNotMatch(await page.content(), /echo:|the app/)

  // Logged in but not a member: no link to open, and the preview shows nothing of the app.
  const benToken = await mintToken(storage, 'ben@example.com')
  const pid = new URL(previewUrl).hostname.split('.')[0]
  assert.equal((await api(server, benToken, 'POST', `/api/rooms/${roomId}/previews/${pid}/open`, {})).status, 404)
  await login(ben, storage.dataDir)
  await ben.page.goto(previewUrl)
  await ben.page.getByTestId('room-ended').filter({ hasText: 'not in it' }).waitFor()
  assert.doesNotMatch(await ben.page.content(), /echo:/)

  // A port that opens is offered; once it closes again the offer goes (it used to stay,
  // offering a dead port).
  const run = (cmd) => api(server, anaToken, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['sh', '-c', cmd], timeout_ms: 30000 })
  // (setsid: out of the command's group, which ends with the command; the command waits until
  // the server listens, 8001 being 1F41 in /proc/net/tcp.)
  await run('setsid python3 -m http.server 8001 >/dev/null 2>&1 & echo $! > port.pid; ' +
    'for i in $(seq 100); do grep -qi ":1F41 " /proc/net/tcp /proc/net/tcp6 && break; sleep 0.1; done')
  await notice.filter({ hasText: 'Port 8001 is open' }).waitFor({ timeout: 30_000 })
  await run('kill "$(cat port.pid)"')
  await notice.waitFor({ state: 'hidden', timeout: 15_000 })

  // Revoked from the panel: the pane's app goes, its socket with it.
  await ana.page.keyboard.press('Alt+0')
  await ana.page.getByTestId('preview-revoke-8000').click()
  await pane.waitFor({ state: 'hidden' })
  await waitFor(async () => (await statusOf(previewUrl)) === 410, 5000, 'the revoked preview still answers')

  assert.deepEqual(ana.errors, [])
  assert.deepEqual(ben.errors, [])
  assert.deepEqual(await server.stop(), { code: 0, signal: null })
})

test('a server without previews offers none: no "preview it?" for an open port, and the panel says why', { skip, timeout: 180_000 }, async (t) => {
  const { storage, server, people: [ana] } = await scene(t, ['ana@example.com'])
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'no previews here')
  const anaToken = await mintToken(storage, 'ana@example.com')
  const started = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/exec`, {
    argv: ['sh', '-c', 'setsid -f python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 </dev/null; ' +
      'python3 -c "import socket, time\nfor _ in range(100):\n    try:\n        socket.create_connection((\'127.0.0.1\', 8000)).close(); break\n    except OSError: time.sleep(0.1)"'],
    timeout_ms: 30000
  })
  assert.equal(started.status, 200, JSON.stringify(started.body))
  // The page looked at the ports after the app listened: it was told previews are off.
  const looked = await ana.page.waitForResponse(async (r) => {
    if (!r.url().endsWith(`/api/rooms/${roomId}/sandbox/ports`)) return false
    const body = await r.json().catch(() => null)
    return body?.listening?.includes(8000) === true
  }, { timeout: 30_000 })
  assert.equal((await looked.json()).previews, false)
  // Whatever that look led to (a request for the previews, an offer) is done by now.
  await ana.page.waitForLoadState('networkidle')
  assert.equal(await ana.page.getByTestId('port-notice').isVisible(), false, 'a port was offered for a preview the server cannot serve')
  await ana.page.keyboard.press('Alt+0')
  await ana.page.getByTestId('previews-off').waitFor()
  assert.deepEqual(ana.errors, [])
})
