// Helpers for end-to-end tests of the Coderoom server with real y-websocket clients.
//
// Storage is either SQLite in a fresh temporary data directory, or (when
// CODEROOM_TEST_POSTGRES_URL is set) a fresh PostgreSQL database created for the test and dropped
// afterwards. Every server spawned here is tracked and killed when the test process exits, even on
// failure, so a failing test never leaves a server behind.

import { spawn, execFile } from 'node:child_process'
import { mkdtemp, rm, access } from 'node:fs/promises'
import { constants as fsConstants } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import WebSocket from 'ws'
import * as Y from 'yjs'
import { WebsocketProvider } from 'y-websocket'
import pg from 'pg'

const here = dirname(fileURLToPath(import.meta.url))

/** Path of the server binary: $CODEROOM_BIN, else target/debug/coderoom of this repository. */
export const CODEROOM_BIN = process.env.CODEROOM_BIN
  ? resolve(process.env.CODEROOM_BIN)
  : resolve(here, '../../../target/debug/coderoom')

/** Admin URL of a PostgreSQL server to create test databases on, or undefined. */
export const PG_ADMIN_URL = process.env.CODEROOM_TEST_POSTGRES_URL || undefined

/**
 * A test's `skip` option for an external dependency: false when the run has it, else the reason
 * (node:test counts the test as skipped). When the run promised the dependency
 * (`CODEROOM_REQUIRE_<NEED>=1`, as .ci/run sets) a missing one fails the test file instead.
 */
export function skipUnless (have, need, reason) {
  if (have) return false
  const promised = `CODEROOM_REQUIRE_${need}`
  if (process.env[promised] === '1') {
    throw new Error(`${reason}, but ${promised}=1 says this run provides it`)
  }
  return reason
}

/** Storage kinds to run every backend-dependent test against. `skip` is a reason or false. */
export const BACKENDS = [
  { kind: 'sqlite', skip: false },
  {
    kind: 'postgres',
    skip: skipUnless(PG_ADMIN_URL, 'POSTGRES', 'CODEROOM_TEST_POSTGRES_URL is not set')
  }
]

const READY_TIMEOUT_MS = 30_000
const STOP_TIMEOUT_MS = 20_000
const ADMIN_TIMEOUT_MS = 60_000
/** How long to wait for the binary to reappear while someone rebuilds it. */
const BIN_WAIT_MS = 180_000

const live = new Set()
process.on('exit', () => {
  for (const child of live) {
    try { child.kill('SIGKILL') } catch {}
  }
})

/**
 * Per-test cleanups, run in reverse order of registration when the test ends, pass or fail
 * (node:test runs `t.after` hooks in registration order, which would drop a database before
 * killing the server that uses it). Usage: `const defer = cleanups(t); defer(() => ...)`.
 */
export function cleanups (t) {
  const stack = []
  t.after(async () => {
    for (const fn of stack.reverse()) {
      try { await fn() } catch (e) { console.error('cleanup failed:', e) }
    }
  })
  return (fn) => stack.push(fn)
}

/** A server on fresh storage of `kind` (started with `serverOpts`, as `startServer` takes them)
 *  and a room on it, all torn down with the test: `{ defer, storage, token, server, roomId }`. */
export async function roomScene (t, { kind = 'sqlite', serverOpts = {} } = {}) {
  const defer = cleanups(t)
  const storage = await createStorage(kind)
  defer(() => storage.cleanup())
  const token = await mintToken(storage)
  const server = await startServer(storage, serverOpts)
  defer(() => server.kill())
  const roomId = await createRoom(server, token)
  return { defer, storage, token, server, roomId }
}

/** `n` y-websocket providers on the scene's room, synced, destroyed with the test. */
export async function syncedProviders ({ defer, server, roomId, token }, n) {
  const clients = []
  defer(() => destroyAll(clients))
  for (let i = 0; i < n; i++) clients.push(openProvider(server, roomId, token))
  await Promise.all(clients.map((c) => waitSynced(c.provider)))
  return clients
}

/** Resolves once `predicate()` is truthy; rejects with `message` after `timeoutMs`. */
export async function waitFor (predicate, timeoutMs, message, intervalMs = 20) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await predicate()) return
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms: ${typeof message === 'function' ? await message() : message}`)
    }
    await sleep(intervalMs)
  }
}

/** Races `promise` against a timeout that rejects with `message`. */
export async function withTimeout (promise, timeoutMs, message) {
  let timer
  const timeout = new Promise((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms: ${message}`)), timeoutMs)
  })
  try {
    return await Promise.race([promise, timeout])
  } finally {
    clearTimeout(timer)
  }
}

async function waitForBinary () {
  await waitFor(async () => {
    try {
      await access(CODEROOM_BIN, fsConstants.X_OK)
      return true
    } catch {
      return false
    }
  }, BIN_WAIT_MS, `server binary ${CODEROOM_BIN} is missing (set CODEROOM_BIN or build it)`, 500)
}

function pgUrlFor (adminUrl, database) {
  const u = new URL(adminUrl)
  u.pathname = '/' + database
  return u.toString()
}

/**
 * Fresh storage for one server (and its restarts): a temporary data directory, plus a fresh
 * PostgreSQL database when `kind` is 'postgres'. Call `cleanup()` when done.
 */
export async function createStorage (kind = 'sqlite') {
  const dataDir = await mkdtemp(join(tmpdir(), 'coderoom-test-'))
  const storage = { kind, dataDir, databaseUrl: undefined, database: undefined }
  if (kind === 'postgres') {
    if (!PG_ADMIN_URL) throw new Error('CODEROOM_TEST_POSTGRES_URL is not set')
    const database = 'coderoom_test_' + randomBytes(6).toString('hex')
    const client = new pg.Client({ connectionString: PG_ADMIN_URL, connectionTimeoutMillis: 10_000 })
    await client.connect()
    try {
      await client.query(`CREATE DATABASE ${database}`)
    } finally {
      await client.end()
    }
    storage.database = database
    storage.databaseUrl = pgUrlFor(PG_ADMIN_URL, database)
  } else if (kind !== 'sqlite') {
    throw new Error(`unknown storage kind ${kind}`)
  }
  storage.args = () => [
    '--data-dir', dataDir,
    ...(storage.databaseUrl ? ['--database-url', storage.databaseUrl] : [])
  ]
  storage.cleanup = async () => {
    if (storage.database) {
      const client = new pg.Client({ connectionString: PG_ADMIN_URL, connectionTimeoutMillis: 10_000 })
      await client.connect()
      try {
        await client.query(`DROP DATABASE IF EXISTS ${storage.database} WITH (FORCE)`)
      } finally {
        await client.end()
      }
      storage.database = undefined
    }
    await rm(dataDir, { recursive: true, force: true })
  }
  return storage
}

/** Mints a bearer token for `email` with `coderoom admin token` on the given storage. */
export async function mintToken (storage, email = 'ana@example.com') {
  await waitForBinary()
  const args = ['admin', 'token', '--email', email, ...storage.args()]
  const stdout = await new Promise((resolve, reject) => {
    execFile(CODEROOM_BIN, args, { timeout: ADMIN_TIMEOUT_MS, env: { ...process.env, CODEROOM_LOG: 'warn' } },
      (err, stdout, stderr) => {
        if (err) reject(new Error(`coderoom admin token failed: ${err.message}\n${stderr}`))
        else resolve(stdout)
      })
  })
  const token = stdout.trim()
  if (!/^\S+$/.test(token)) throw new Error(`unexpected token output: ${JSON.stringify(stdout)}`)
  return token
}

/**
 * Starts `coderoom serve` on a free loopback port with the given storage and resolves once it
 * printed its listening line. The returned object has `url`, `wsUrl(roomId)`, `stop()` (graceful,
 * asserts exit 0), `kill()` and `logs()` (stderr tail).
 */
/** `email` joins `roomId` as `role` through an invite made with `ownerToken` (the API's way, as
 *  the invite page does); returns their token and user id. */
export async function joinByInvite (server, storage, roomId, ownerToken, email, role = 'editor') {
  const token = await mintToken(storage, email)
  const invite = await api(server, ownerToken, 'POST', `/api/rooms/${roomId}/invites`, { role, ttl_s: 3600, max_uses: 1 })
  if (invite.status !== 201) throw new Error(`invite: ${invite.status} ${JSON.stringify(invite.body)}`)
  const accepted = await api(server, token, 'POST', `/api/invites/${invite.body.token}/accept`, {})
  if (accepted.status !== 200) throw new Error(`accept: ${accepted.status} ${JSON.stringify(accepted.body)}`)
  const id = (await api(server, token, 'GET', '/api/me')).body.id
  return { token, id }
}

export async function startServer (storage, { extraArgs = [], env = {}, listen = '127.0.0.1:0' } = {}) {
  await waitForBinary()
  const args = ['serve', '--listen', listen, ...storage.args(), ...extraArgs]
  const child = spawn(CODEROOM_BIN, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    // No warm pool unless a test asks for one: tests count sandboxes, and one started per server
    // (`auto`) costs a 2-CPU machine running many servers.
    env: { ...process.env, CODEROOM_LOG: process.env.CODEROOM_LOG || 'info,sqlx=warn,tower_http=warn', CODEROOM_SANDBOX_WARM_POOL: '0', ...env }
  })
  live.add(child)
  let stderr = ''
  let stdout = ''
  child.stderr.setEncoding('utf8')
  child.stderr.on('data', (d) => {
    stderr += d
    if (stderr.length > 200_000) stderr = stderr.slice(-100_000)
  })
  const exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      live.delete(child)
      resolve({ code, signal })
    })
  })
  const server = {
    child,
    storage,
    exited,
    logs: (n = 8000) => stderr.slice(-n),
    exitStatus: null
  }
  const port = await withTimeout(new Promise((resolve, reject) => {
    child.stdout.setEncoding('utf8')
    child.stdout.on('data', (d) => {
      stdout += d
      const m = stdout.match(/^listening on http:\/\/127\.0\.0\.1:(\d+)$/m)
      if (m) resolve(Number(m[1]))
    })
    child.on('error', reject)
    exited.then(({ code, signal }) =>
      reject(new Error(`server exited before listening (code ${code}, signal ${signal})\n${stderr.slice(-4000)}`)))
  }), READY_TIMEOUT_MS, 'server did not print its listening line').catch((e) => {
    child.kill('SIGKILL')
    throw e
  })
  // Whatever follows on stdout is unexpected but harmless; keep draining it.
  server.port = port
  server.stdout = () => stdout
  server.url = `http://127.0.0.1:${port}`
  server.docBase = (roomId) => `ws://127.0.0.1:${port}/api/rooms/${roomId}`
  server.kill = () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    return exited
  }
  /** SIGTERM, wait for the exit, and return { code, signal }. Kills it if it overstays. */
  server.stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM')
    try {
      server.exitStatus = await withTimeout(exited, STOP_TIMEOUT_MS, 'server did not exit after SIGTERM')
    } catch (e) {
      child.kill('SIGKILL')
      await exited
      throw new Error(`${e.message}\n${stderr.slice(-4000)}`)
    }
    return server.exitStatus
  }
  return server
}

/** `fetch` against the server with the bearer token; returns { status, body }. */
export async function api (server, token, method, path, body) {
  const res = await fetch(server.url + path, {
    method,
    headers: {
      ...(token ? { Authorization: `Bearer ${token}` } : {}),
      ...(body !== undefined ? { 'Content-Type': 'application/json' } : {})
    },
    body: body !== undefined ? JSON.stringify(body) : undefined,
    signal: AbortSignal.timeout(15_000)
  })
  const text = await res.text()
  let json
  try { json = JSON.parse(text) } catch { json = undefined }
  return { status: res.status, body: json ?? text }
}

/** Creates a room owned by the token's user and returns its id. */
export async function createRoom (server, token, name = 'test room') {
  const res = await api(server, token, 'POST', '/api/rooms', { name })
  if (res.status !== 201 || typeof res.body?.id !== 'string') {
    throw new Error(`POST /api/rooms answered ${res.status}: ${JSON.stringify(res.body)}`)
  }
  return res.body.id
}

/** A `ws` WebSocket class that sends `Authorization: Bearer TOKEN` on the upgrade request. */
export function authedWebSocket (token) {
  return class AuthedWebSocket extends WebSocket {
    constructor (url, protocols) {
      super(url, protocols, { headers: { Authorization: `Bearer ${token}` } })
    }
  }
}

/**
 * Opens a real y-websocket provider on the room's document (`{docBase}/doc`). BroadcastChannel is
 * disabled: providers in one Node process would otherwise sync with each other without the server.
 */
export function openProvider (server, roomId, token, doc = new Y.Doc(), opts = {}) {
  const provider = new WebsocketProvider(server.docBase(roomId), 'doc', doc, {
    WebSocketPolyfill: authedWebSocket(token),
    disableBc: true,
    ...opts
  })
  // Keep close events around for diagnostics.
  provider.closeEvents = []
  provider.on('connection-close', (event) => {
    if (event) provider.closeEvents.push({ code: event.code, reason: event.reason })
  })
  return { doc, provider }
}

/** Resolves once the provider has received the server's sync step 2. */
export async function waitSynced (provider, timeoutMs = 15_000) {
  if (provider.synced) return
  await withTimeout(new Promise((resolve) => {
    const onSync = (synced) => {
      if (synced) {
        provider.off('sync', onSync)
        resolve()
      }
    }
    provider.on('sync', onSync)
  }), timeoutMs, `provider did not sync (closes seen: ${JSON.stringify(provider.closeEvents)})`)
}

/** Plain JSON of the document layout: { path: text }. */
export function filesJson (doc) {
  const out = {}
  // Sorted: a Y.Map's iteration order is local insertion order, which replicas need not share.
  for (const [path, text] of [...doc.getMap('files').entries()].sort((a, b) => a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)) {
    out[path] = text instanceof Y.Text ? text.toString() : { notText: String(text) }
  }
  return out
}

/** The server's copy of the document's files ({path: text}), read by a fresh client. */
export async function serverFiles (server, roomId, token) {
  const c = openProvider(server, roomId, token)
  try {
    await waitSynced(c.provider)
    return filesJson(c.doc)
  } finally {
    destroyAll([c])
  }
}

/** The document's state vector as a plain object, for comparisons. */
export function stateVector (doc) {
  return Object.fromEntries([...Y.decodeStateVector(Y.encodeStateVector(doc)).entries()].sort((a, b) => a[0] - b[0]))
}

/**
 * Disconnects and destroys providers (`{ provider, doc }` pairs or bare providers), their
 * awareness (whose timer would keep the process alive) and their docs. Content stays readable.
 */
export function destroyAll (providers) {
  for (const p of providers) {
    const provider = p.provider ?? p
    try {
      provider.destroy()
      provider.awareness.destroy()
      provider.doc.destroy()
    } catch {}
  }
}

export { Y, sleep }

/** Path of the reference y-websocket server's executable (npm @y/websocket-server). */
export const REFERENCE_SERVER_JS = fileURLToPath(new URL('../node_modules/@y/websocket-server/src/server.js', import.meta.url))

/** A free loopback TCP port (bound, then released: there is a small window for a race). */
export async function freePort () {
  const net = await import('node:net')
  return await new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

/**
 * Starts the reference Node y-websocket server (no auth, in-memory documents) as a child process
 * on a free loopback port. Same shape as startServer's result where it matters: `docBase(room)`,
 * `stop()`, `kill()`, `child`.
 */
export async function startReferenceServer ({ env = {} } = {}) {
  const port = await freePort()
  const child = spawn(process.execPath, [REFERENCE_SERVER_JS], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, HOST: '127.0.0.1', PORT: String(port), ...env }
  })
  live.add(child)
  let output = ''
  const exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      live.delete(child)
      resolve({ code, signal })
    })
  })
  child.stderr.setEncoding('utf8')
  child.stderr.on('data', (d) => { output = (output + d).slice(-20_000) })
  await withTimeout(new Promise((resolve, reject) => {
    child.stdout.setEncoding('utf8')
    child.stdout.on('data', (d) => {
      output = (output + d).slice(-20_000)
      if (/running at/.test(output)) resolve()
    })
    child.on('error', reject)
    exited.then(({ code, signal }) => reject(new Error(`reference server exited (code ${code}, signal ${signal})\n${output}`)))
  }), READY_TIMEOUT_MS, 'reference server did not start').catch((e) => {
    child.kill('SIGKILL')
    throw e
  })
  return {
    child,
    port,
    exited,
    url: `http://127.0.0.1:${port}`,
    // The reference server serves any path as a document name: room "X" is ws://host:port/X/doc.
    docBase: (roomId) => `ws://127.0.0.1:${port}/${roomId}`,
    logs: () => output.slice(-8000),
    kill: () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
      return exited
    },
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM')
      return await withTimeout(exited, STOP_TIMEOUT_MS, 'reference server did not exit')
    }
  }
}

export { WebsocketProvider, WebSocket }
