// The Repositories panel in a real browser, against a real git server on loopback (git
// http-backend behind a token check, run by this test): a token added as a room secret, the
// repository connected from the page, its files in the workspace, a change pushed from the page
// with its author, and an editor's ask to open the network approved by the owner.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { spawn, execFileSync } from 'node:child_process'
import { mkdtempSync, writeFileSync, mkdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { skipUnless, waitFor, mintToken, api } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

const gitEnv = {
  ...process.env,
  GIT_CONFIG_GLOBAL: '/dev/null',
  GIT_CONFIG_NOSYSTEM: '1',
  GIT_AUTHOR_NAME: 'Seed',
  GIT_AUTHOR_EMAIL: 'seed@example.com',
  GIT_COMMITTER_NAME: 'Seed',
  GIT_COMMITTER_EMAIL: 'seed@example.com'
}
const git = (cwd, ...args) => execFileSync('git', args, { cwd, env: gitEnv, encoding: 'utf8' })

/** A bare repository with one commit, served by git http-backend to requests carrying the token. */
async function gitServer (t, token) {
  const root = mkdtempSync(join(tmpdir(), 'coderoom-git-'))
  t.after(() => rmSync(root, { recursive: true, force: true }))
  const bare = join(root, 'app.git')
  mkdirSync(bare)
  git(bare, 'init', '--bare', '-q', '-b', 'main')
  git(bare, 'config', 'http.receivepack', 'true')
  const seed = join(root, 'seed')
  mkdirSync(seed)
  git(seed, 'init', '-q', '-b', 'main')
  writeFileSync(join(seed, 'README.md'), '# App\n')
  git(seed, 'add', '-A')
  git(seed, 'commit', '-q', '-m', 'seed')
  git(seed, 'push', '-q', bare, 'main')
  const server = http.createServer((req, res) => {
    if (req.headers.authorization !== `Bearer ${token}`) {
      res.writeHead(401, { 'WWW-Authenticate': 'Basic realm="git"' })
      res.end('token required\n')
      return
    }
    const url = new URL(req.url, 'http://x')
    const cgi = spawn('git', ['http-backend'], {
      env: {
        PATH: process.env.PATH,
        GIT_PROJECT_ROOT: root,
        GIT_HTTP_EXPORT_ALL: '1',
        REQUEST_METHOD: req.method,
        PATH_INFO: url.pathname,
        QUERY_STRING: url.search.slice(1),
        CONTENT_TYPE: req.headers['content-type'] ?? '',
        HTTP_CONTENT_ENCODING: req.headers['content-encoding'] ?? '',
        REMOTE_USER: 'room',
        REMOTE_ADDR: '127.0.0.1'
      }
    })
    req.pipe(cgi.stdin)
    const chunks = []
    cgi.stdout.on('data', (c) => chunks.push(c))
    cgi.on('close', () => {
      const out = Buffer.concat(chunks)
      let at = out.indexOf('\r\n\r\n')
      let gap = 4
      if (at < 0) { at = out.indexOf('\n\n'); gap = 2 }
      const headers = {}
      let status = 200
      for (const line of out.subarray(0, at).toString().split(/\r?\n/)) {
        const i = line.indexOf(':')
        if (i < 0) continue
        const k = line.slice(0, i).trim()
        const v = line.slice(i + 1).trim()
        if (k.toLowerCase() === 'status') status = Number(v.split(' ')[0])
        else headers[k] = v
      }
      res.writeHead(status, headers)
      res.end(out.subarray(at + gap))
    })
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => server.close())
  return { port: server.address().port, bare }
}

test('a repository is connected and pushed from the page; an editor asks to open the network',
  { skip, timeout: 180_000 }, async (t) => {
    const token = `ghp_${Math.random().toString(36).slice(2)}${Date.now()}`
    const origin = await gitServer(t, token)
    const { storage, server, people: [ana, ben] } = await scene(t, ['ana@example.com', 'ben@example.com'],
      { extraArgs: ['--egress-test-resolve', `git.test=127.0.0.1:${origin.port}`] })
    await login(ana, storage.dataDir)
    const roomId = await createRoomFromPage(ana, 'with a repository')
    const anaToken = await mintToken(storage, 'ana@example.com')
    const benToken = await mintToken(storage, 'ben@example.com')
    const invite = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/invites`, { role: 'editor', ttl_s: 3600, max_uses: 1 })
    assert.equal((await api(server, benToken, 'POST', `/api/invites/${invite.body.token}/accept`)).status, 200)
    // The token goes in as a secret for the git host, from the Secrets panel (Alt+5).
    await ana.page.keyboard.press('Alt+5')
    await ana.page.getByTestId('secret-name').fill('GIT_TOKEN')
    await ana.page.getByTestId('secret-value').fill(token)
    await ana.page.getByTestId('secret-hosts').fill('git.test')
    await ana.page.getByTestId('secret-add').click()
    await ana.page.getByTestId('secret').filter({ hasText: 'GIT_TOKEN' }).waitFor()
    // Alt+7: Repositories. Connect with the secret, read and push.
    await ana.page.keyboard.press('Alt+7')
    await ana.page.getByTestId('repo-url').fill(`http://git.test:${origin.port}/app.git`)
    await ana.page.getByTestId('repo-secret').selectOption('GIT_TOKEN')
    await ana.page.getByTestId('repo-access').selectOption('push')
    await ana.page.getByTestId('repo-connect').click()
    const repo = ana.page.getByTestId('repo-app')
    await repo.waitFor({ timeout: 30_000 })
    assert.match(await repo.innerText(), /read and push/)
    const read = await api(server, anaToken, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['cat', 'app/README.md'], timeout_ms: 30000 })
    assert.equal(read.body.stdout, '# App\n')
    // A change in the workspace, pushed from the page: the commit is Ana's.
    await api(server, anaToken, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['sh', '-c', 'echo more >> app/README.md'], timeout_ms: 30000 })
    await ana.page.getByTestId('push-message-app').fill('More words')
    await ana.page.getByTestId('push-app').click()
    await waitFor(() => git(origin.bare, 'log', '-1', '--format=%an <%ae>|%s', 'main').trim() === 'ana <ana@example.com>|More words',
      15_000, 'the push never reached the repository')
    await shot(ana.page, '20-repositories')
    const html = await ana.page.content()
    assert.ok(!html.includes(token), 'the page holds the token')

    // Ben (an editor) asks to open a host; Ana approves it; Ben's one click adds it.
    await login(ben, storage.dataDir)
    await ben.page.goto(`${server.url}/rooms/${roomId}`)
    await ben.page.getByTestId('conn-status').filter({ hasText: 'Synced' }).waitFor()
    await ben.page.keyboard.press('Alt+6')
    await ben.page.getByTestId('egress-rule').fill('registry.npmjs.org')
    await ben.page.getByTestId('egress-add').click()
    await ben.page.getByText('Asked to allow registry.npmjs.org').waitFor()
    await ana.page.keyboard.press('Alt+2')
    await ana.page.getByRole('button', { name: 'Refresh' }).click()
    const approve = ana.page.locator('[data-testid^="approve-"]').first()
    await approve.waitFor()
    await approve.click()
    await ben.page.keyboard.press('Alt+2')
    const use = ben.page.locator('[data-testid^="use-"]').first()
    await use.waitFor()
    assert.match(await use.innerText(), /Allow registry\.npmjs\.org/)
    await use.click()
    await waitFor(async () => (await api(server, anaToken, 'GET', `/api/rooms/${roomId}/egress`)).body?.allow?.includes('registry.npmjs.org'),
      10_000, 'the approved rule never reached the allowlist')
    assert.deepEqual(ana.errors, [])
    assert.deepEqual(ben.errors, [])
    assert.deepEqual(await server.stop(), { code: 0, signal: null })
  })
