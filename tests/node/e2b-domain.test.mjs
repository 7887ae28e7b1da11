// The E2B SDKs' own address shape (`--e2b-domain`): a harness sets only E2B_API_KEY and
// E2B_DOMAIN, and the stock npm SDK reaches `https://api.<domain>` (the control plane),
// `https://49983-<room>.<domain>` (envd) and, through `getHost(port)`, `<port>-<room>.<domain>`
// (a port of the room's sandbox, under the preview rules). Wildcard DNS is a resolver override
// (tools/e2b-resolve.mjs) and TLS ends at a front in the test with a certificate for
// `*.<domain>`, as a proxy would in production. The harness runs in a process of its own.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, execFileSync } from 'node:child_process'
import { mkdtempSync, writeFileSync, rmSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import https from 'node:https'
import http from 'node:http'
import { fileURLToPath } from 'node:url'
import { cleanups, createStorage, startServer, mintToken, api, createRoom, skipUnless, freePort, waitFor, joinByInvite } from './lib/server.mjs'

const DOMAIN = 'e2b.test'
let haveOpenssl = true
try { execFileSync('openssl', ['version'], { stdio: 'ignore' }) } catch { haveOpenssl = false }
const skip = skipUnless(haveOpenssl, 'OPENSSL', 'no openssl to make the test certificate (apt-get install openssl)')

/** A TLS front for `*.DOMAIN` passing each request, its Host kept, to `server`. */
async function tlsFront (defer, dir, server) {
  const key = join(dir, 'key.pem')
  const cert = join(dir, 'cert.pem')
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1',
    '-nodes', '-keyout', key, '-out', cert, '-days', '1', '-subj', `/CN=*.${DOMAIN}`,
    '-addext', `subjectAltName=DNS:*.${DOMAIN},DNS:${DOMAIN}`], { stdio: 'ignore' })
  const target = new URL(server.url)
  const front = https.createServer({ key: readFileSync(key), cert: readFileSync(cert) }, (req, res) => {
    const up = http.request({ host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode, r.headers)
      r.pipe(res)
    })
    up.on('error', () => { res.writeHead(502); res.end() })
    req.pipe(up)
  })
  await new Promise((resolve) => front.listen(0, '127.0.0.1', resolve))
  defer(() => new Promise((resolve) => { front.closeAllConnections(); front.close(resolve) }))
  return { cert, port: front.address().port }
}

/** Runs `script` (ESM, the SDK importable) with only the SDK's variables set, as a harness;
 *  the JSON its last line prints. */
async function harness (dir, script, env) {
  const file = join(fileURLToPath(new URL('.', import.meta.url)), `.e2b-harness-${process.pid}-${Date.now()}.mjs`)
  writeFileSync(file, script)
  try {
    const preload = fileURLToPath(new URL('./tools/e2b-resolve.mjs', import.meta.url))
    const child = spawn(process.execPath, ['--import', preload, file], {
      env: { PATH: process.env.PATH, ...env },
      stdio: ['ignore', 'pipe', 'pipe']
    })
    let out = ''
    let err = ''
    child.stdout.on('data', (d) => { out += d })
    child.stderr.on('data', (d) => { err += d })
    const code = await new Promise((resolve) => child.on('exit', resolve))
    const last = out.trim().split('\n').pop()
    try { return JSON.parse(last) } catch {
      throw new Error(`the harness printed no result (exit ${code}):\n${out}\n${err}`)
    }
  } finally {
    rmSync(file, { force: true })
  }
}

test('the stock npm SDK works with only E2B_API_KEY and E2B_DOMAIN, getHost included', { skip, timeout: 180_000 }, async (t) => {
  const defer = cleanups(t)
  const dir = mkdtempSync(join(tmpdir(), 'coderoom-e2b-domain-'))
  defer(() => rmSync(dir, { recursive: true, force: true }))
  const storage = await createStorage('sqlite')
  defer(() => storage.cleanup())
  const previewPort = await freePort()
  const server = await startServer(storage, {
    extraArgs: ['--e2b-domain', DOMAIN, '--preview-url', `http://{id}.preview.localhost:${previewPort}`,
      '--preview-listen', `127.0.0.1:${previewPort}`]
  })
  defer(() => server.kill())
  const front = await tlsFront(defer, dir, server)
  const ana = await mintToken(storage, 'ana@example.com')
  const roomId = await createRoom(server, ana)
  const made = await api(server, ana, 'POST', `/api/rooms/${roomId}/agents`,
    { name: 'harness', capabilities: ['observe', 'edit', 'type', 'publish'], ttl_s: 3600 })
  assert.equal(made.status, 201, JSON.stringify(made.body))
  const env = {
    E2B_API_KEY: made.body.token,
    E2B_DOMAIN: DOMAIN,
    NODE_EXTRA_CA_CERTS: front.cert,
    E2B_TEST_DOMAIN: DOMAIN,
    E2B_TEST_TLS_PORT: String(front.port)
  }
  const out = await harness(dir, `
import { Sandbox } from 'e2b'
const out = {}
const sbx = await Sandbox.create()
out.id = sbx.sandboxId
out.ran = (await sbx.commands.run('echo hi from $PWD')).stdout
await sbx.files.write('/home/user/site/hello.txt', 'served\\n')
out.read = await sbx.files.read('/home/user/site/hello.txt')
await sbx.commands.run('cd site && exec python3 -m http.server 3000 --bind 127.0.0.1', { background: true })
const host = sbx.getHost(3000)
out.host = host
const get = async (headers) => {
  for (let i = 0; i < 100; i++) {
    const r = await fetch('https://' + host + '/hello.txt', { headers })
    if (r.status !== 502 && r.status !== 503) return [r.status, await r.text()]
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
  return ['never up']
}
out.stranger = await get({})
out.mine = await get({ 'e2b-traffic-access-token': sbx.trafficAccessToken })
out.killed = await sbx.kill()
console.log(JSON.stringify(out))
`, env)
  assert.equal(out.id, roomId)
  assert.equal(out.ran, 'hi from /workspace\n')
  assert.equal(out.read, 'served\n')
  assert.equal(out.host, `3000-${roomId}.${DOMAIN}`)
  // Nobody but the session reaches a port that is not public.
  assert.equal(out.stranger[0], 403, JSON.stringify(out.stranger))
  assert.deepEqual(out.mine, [200, 'served\n'])
  assert.equal(out.killed, true)
  // Reaching it made a room preview of port 3000, recorded as the agent's.
  const previews = (await api(server, ana, 'GET', `/api/rooms/${roomId}/previews`)).body
  assert.ok(previews.some((p) => p.port === 3000 && p.visibility === 'room'), JSON.stringify(previews))

  // A public preview of the port, once someone other than the asker (and its sponsor)
  // approves it, answers anyone at the same host.
  const started = await api(server, ana, 'POST', `/api/rooms/${roomId}/exec`,
    { argv: ['sh', '-c', 'cd site && setsid -f python3 -m http.server 3000 --bind 127.0.0.1 >/dev/null 2>&1 </dev/null; ' +
      // Returns once it listens (a process still detaching when its command returns goes
      // with the command's process group).
      'python3 -c "import socket, time\nfor _ in range(100):\n    try:\n        socket.create_connection((\'127.0.0.1\', 3000)).close(); break\n    except OSError: time.sleep(0.1)"'] })
  assert.equal(started.status, 200, JSON.stringify(started.body))
  const asked = await api(server, made.body.token, 'POST', `/api/rooms/${roomId}/previews`,
    { port: 3000, visibility: 'public', ttl_s: 600 })
  assert.equal(asked.status, 201, JSON.stringify(asked.body))
  const stranger = () => new Promise((resolve, reject) => {
    const req = https.request({
      host: '127.0.0.1',
      port: front.port,
      path: '/hello.txt',
      servername: out.host,
      headers: { host: out.host },
      ca: readFileSync(front.cert)
    }, (res) => {
      let body = ''
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve([res.statusCode, body]))
    })
    req.on('error', reject)
    req.end()
  })
  assert.equal((await stranger())[0], 403)
  // The agent's sponsor may not approve what it asks: another owner does.
  const ben = await joinByInvite(server, storage, roomId, ana, 'ben@example.com', 'owner')
  const decided = await api(server, ben.token, 'POST', `/api/rooms/${roomId}/approvals/${asked.body.approval_id}/decision`, { approve: true })
  assert.equal(decided.status, 200, JSON.stringify(decided.body))
  let seen
  await waitFor(async () => { seen = await stranger(); return seen[0] === 200 }, 15_000, () => `the public port answered ${JSON.stringify(seen)}`, 250)
  assert.equal(seen[1], 'served\n')
})
