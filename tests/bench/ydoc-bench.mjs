#!/usr/bin/env node
// Edit-to-peer latency and throughput of Coderoom's document WebSocket, side by side with the
// reference Node y-websocket server (@y/websocket-server), under the same workload in one run.
//
// N real y-websocket clients (spread over worker threads) join one room; each inserts a small
// timestamped marker at a random position of files/bench.txt at a steady rate for a fixed
// duration. Every client records, for every remote edit it observes, now - timestamp. The report
// gives edits/s sent, remote edits applied by peers per second, the share delivered, p50/p99/max
// edit-to-peer latency, and the server's CPU use and resident memory.
//
// Usage (from tests/node, after `npm ci`):
//   node ../bench/ydoc-bench.mjs [--clients 8,32] [--duration 10] [--rate 10] [--warmup 1]
//                                [--workers 2] [--targets coderoom,reference] [--storage sqlite|postgres]
//                                [--repeat 1] [--presence] [--json FILE]
// --presence gives every client an awareness state (renewed every 15 s by y-protocols); without
// it the clients send no presence at all and only document sync is measured.
// CODEROOM_BIN selects the server binary (default: target/release/coderoom if it exists, else
// target/debug/coderoom). --storage postgres needs CODEROOM_TEST_POSTGRES_URL (an admin URL; a
// fresh database is created and dropped per run).

import { Worker } from 'node:worker_threads'
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { performance } from 'node:perf_hooks'
import { fileURLToPath } from 'node:url'
import { cpus } from 'node:os'
import { parseArgs } from 'node:util'

if (!process.env.CODEROOM_BIN) {
  const release = fileURLToPath(new URL('../../target/release/coderoom', import.meta.url))
  const debug = fileURLToPath(new URL('../../target/debug/coderoom', import.meta.url))
  process.env.CODEROOM_BIN = existsSync(release) ? release : debug
}
const {
  Y, WebsocketProvider, WebSocket, authedWebSocket, createStorage, mintToken, startServer, createRoom,
  startReferenceServer, waitFor, withTimeout, CODEROOM_BIN
} = await import('../node/lib/server.mjs')

const { values: opts } = parseArgs({
  options: {
    clients: { type: 'string', default: '8' },
    duration: { type: 'string', default: '10' },
    rate: { type: 'string', default: '10' },
    warmup: { type: 'string', default: '1' },
    workers: { type: 'string', default: '2' },
    targets: { type: 'string', default: 'coderoom,reference' },
    storage: { type: 'string', default: 'sqlite' },
    drain: { type: 'string', default: '15' },
    repeat: { type: 'string', default: '1' },
    presence: { type: 'boolean', default: false },
    json: { type: 'string' }
  }
})
const clientCounts = opts.clients.split(',').map(Number)
const durationMs = Number(opts.duration) * 1000
const ratePerClient = Number(opts.rate)
const warmupMs = Number(opts.warmup) * 1000
const maxWorkers = Number(opts.workers)
const targets = opts.targets.split(',')
const drainMs = Number(opts.drain) * 1000
const repeat = Number(opts.repeat)
for (const [name, v] of [['clients', Math.min(...clientCounts)], ['duration', durationMs], ['rate', ratePerClient], ['workers', maxWorkers], ['repeat', repeat]]) {
  if (!(v > 0) || !Number.isFinite(v)) throw new Error(`--${name} must be positive`)
}
if (repeat > 10 || durationMs > 600_000 || Math.max(...clientCounts) > 256 || ratePerClient > 1000) {
  throw new Error('bounded benchmark: at most 600 s, 256 clients, 1000 edits/s per client')
}
for (const t of targets) if (!['coderoom', 'reference'].includes(t)) throw new Error(`unknown target ${t}`)

const now = () => performance.timeOrigin + performance.now()
const CLK_TCK = 100 // Linux USER_HZ

function procCpuSeconds (pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return (Number(fields[11]) + Number(fields[12])) / CLK_TCK // utime + stime
  } catch {
    return NaN
  }
}
function procRssMiB (pid) {
  try {
    const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB/m)
    return m ? Number(m[1]) / 1024 : NaN
  } catch {
    return NaN
  }
}

function quantile (sorted, q) {
  if (sorted.length === 0) return NaN
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))
  return sorted[i]
}

/** Coderoom's own view: how many batched log appends it made and their mean latency. */
async function persistStats (server) {
  try {
    const res = await fetch(`${server.url}/metrics`, { signal: AbortSignal.timeout(5000) })
    const text = await res.text()
    const num = (re) => Number(text.match(re)?.[1] ?? NaN)
    const count = num(/^coderoom_persist_seconds_count\s+(\S+)/m)
    const sum = num(/^coderoom_persist_seconds_sum\s+(\S+)/m)
    return {
      serverAppends: count,
      serverUpdatesLogged: num(/^coderoom_updates_applied_total\s+(\S+)/m),
      serverAppendMeanMs: (1000 * sum) / count
    }
  } catch {
    return undefined
  }
}

/** Starts the target server and a room on it; returns what the clients need. */
async function setUp (target) {
  if (target === 'coderoom') {
    const storage = await createStorage(opts.storage)
    try {
      const token = await mintToken(storage, 'bench@example.com')
      // Quiet logs: per-connection info lines would cost the server time.
      const server = await startServer(storage, { env: { CODEROOM_LOG: 'warn' } })
      const room = await createRoom(server, token, 'bench')
      return { server, docBase: server.docBase(room), token, cleanup: async () => { await server.kill(); await storage.cleanup() } }
    } catch (e) {
      await storage.cleanup()
      throw e
    }
  }
  const server = await startReferenceServer()
  const room = 'bench-' + Math.random().toString(36).slice(2)
  return { server, docBase: server.docBase(room), token: undefined, cleanup: () => server.kill() }
}

/** One client creates files/bench.txt before the measured clients join. */
async function seed ({ docBase, token }) {
  const doc = new Y.Doc()
  const provider = new WebsocketProvider(docBase, 'doc', doc, {
    WebSocketPolyfill: token ? authedWebSocket(token) : WebSocket,
    disableBc: true
  })
  try {
    await waitFor(() => provider.synced, 15_000, 'seeding client did not sync')
    doc.getMap('files').set('bench.txt', new Y.Text())
    // Let it reach the server: a second client must see it.
    const probe = new Y.Doc()
    const p2 = new WebsocketProvider(docBase, 'doc', probe, {
      WebSocketPolyfill: token ? authedWebSocket(token) : WebSocket,
      disableBc: true
    })
    try {
      await waitFor(() => p2.synced && probe.getMap('files').get('bench.txt') instanceof Y.Text, 15_000, 'seed did not reach the server')
    } finally {
      p2.destroy(); p2.awareness.destroy(); probe.destroy()
    }
  } finally {
    provider.destroy(); provider.awareness.destroy(); doc.destroy()
  }
}

async function runOne (target, nClients) {
  const env = await setUp(target)
  const workers = []
  try {
    await seed(env)
    const nWorkers = Math.min(maxWorkers, nClients)
    for (let w = 0; w < nWorkers; w++) {
      const clientIds = []
      for (let id = w; id < nClients; id += nWorkers) clientIds.push(id)
      const worker = new Worker(new URL('./bench-worker.mjs', import.meta.url), {
        workerData: { docBase: env.docBase, token: env.token, clientIds, ratePerClient, totalClients: nClients, seed: 0x9e3779b9 ^ (w + 1), presence: opts.presence }
      })
      const box = { inbox: [], waiters: [] }
      worker.on('message', (m) => {
        if (m.type === 'error') {
          box.error = m.message
          box.waiters.splice(0).forEach((w) => w.reject(new Error(`worker: ${m.message}`)))
          return
        }
        const i = box.waiters.findIndex((x) => x.type === m.type)
        if (i >= 0) box.waiters.splice(i, 1)[0].resolve(m)
        else box.inbox.push(m)
      })
      worker.on('error', (e) => { box.error = String(e); box.waiters.splice(0).forEach((w) => w.reject(e)) })
      box.next = (type) => {
        if (box.error) return Promise.reject(new Error(`worker: ${box.error}`))
        const i = box.inbox.findIndex((m) => m.type === type)
        if (i >= 0) return Promise.resolve(box.inbox.splice(i, 1)[0])
        return new Promise((resolve, reject) => box.waiters.push({ type, resolve, reject }))
      }
      workers.push({ worker, box })
    }
    await withTimeout(Promise.all(workers.map((w) => w.box.next('ready'))), 60_000, 'clients did not get ready')

    const pid = env.server.child.pid
    const startAt = now() + 300
    const stopAt = startAt + durationMs
    const warmupUntil = startAt + warmupMs
    const cpu0 = procCpuSeconds(pid)
    for (const w of workers) w.worker.postMessage({ type: 'start', startAt, stopAt, warmupUntil })
    const sentMsgs = await withTimeout(Promise.all(workers.map((w) => w.box.next('sent'))), durationMs + 60_000, 'clients did not finish editing')
    const cpu1 = procCpuSeconds(pid)
    const totalSent = sentMsgs.flatMap((m) => m.sent).reduce((a, c) => a + c.sent, 0)
    for (const w of workers) w.worker.postMessage({ type: 'expect', totalSent, drainMs })
    const results = await withTimeout(Promise.all(workers.map((w) => w.box.next('result'))), drainMs + 60_000, 'clients did not report')
    const rss = procRssMiB(pid)
    const persist = target === 'coderoom' ? await persistStats(env.server) : undefined

    const clients = results.flatMap((r) => r.clients)
    const observed = clients.reduce((a, c) => a + c.observed, 0)
    const expected = clients.reduce((a, c) => a + c.expected, 0)
    const hashes = new Set(clients.map((c) => c.hash))
    const latencies = Float64Array.from(results.flatMap((r) => Array.from(r.latencies))).sort()
    const editSeconds = durationMs / 1000
    const row = {
      target,
      storage: target === 'coderoom' ? opts.storage : 'memory',
      clients: nClients,
      ratePerClient,
      durationS: editSeconds,
      editsSent: totalSent,
      editsPerS: totalSent / editSeconds,
      appliedByPeers: observed,
      appliedPerS: observed / editSeconds,
      deliveredPct: expected ? (100 * observed) / expected : NaN,
      p50Ms: quantile(latencies, 0.5),
      p99Ms: quantile(latencies, 0.99),
      maxMs: latencies.length ? latencies[latencies.length - 1] : NaN,
      samples: latencies.length,
      serverCpuPct: (100 * (cpu1 - cpu0)) / editSeconds,
      serverRssMiB: rss,
      converged: hashes.size === 1,
      ...(persist ?? {}),
      closes: clients.reduce((a, c) => a + c.closes.length, 0)
    }
    const closeCodes = {}
    for (const c of clients) for (const code of c.closes) closeCodes[code] = (closeCodes[code] || 0) + 1
    if (Object.keys(closeCodes).length) {
      row.closeCodes = closeCodes
      console.error(`${target}: connections closed during the run: ${JSON.stringify(closeCodes)}`)
      if (env.server.logs) console.error(`${target} server log tail:\n${env.server.logs().split('\n').slice(-15).join('\n')}`)
    }
    for (const w of workers) w.worker.postMessage({ type: 'exit' })
    await Promise.all(workers.map((w) => withTimeout(new Promise((resolve) => w.worker.once('exit', resolve)), 10_000, 'worker exit').catch(() => w.worker.terminate())))
    return row
  } finally {
    for (const w of workers) await w.worker.terminate().catch(() => {})
    await env.cleanup()
  }
}

const fmt = (v, d = 1) => (Number.isFinite(v) ? v.toFixed(d) : 'n/a')
function table (rows) {
  const head = '| server | clients | run | edits/s sent | remote edits applied/s | delivered | p50 ms | p99 ms | max ms | server CPU | server RSS MiB | converged |'
  const sep = '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|'
  const lines = rows.map((r) => `| ${r.target === 'coderoom' ? `coderoom (${r.storage})` : 'reference @y/websocket-server (memory)'} | ${r.clients} | ${r.run} | ${fmt(r.editsPerS)} | ${fmt(r.appliedPerS)} | ${fmt(r.deliveredPct, 2)}% | ${fmt(r.p50Ms, 2)} | ${fmt(r.p99Ms, 2)} | ${fmt(r.maxMs, 1)} | ${fmt(r.serverCpuPct, 0)}% | ${fmt(r.serverRssMiB, 1)} | ${r.converged ? 'yes' : 'NO'}${r.closes ? ` (${r.closes} closes)` : ''} |`)
  return [head, sep, ...lines].join('\n')
}

const rows = []
const started = Date.now()
console.error(`coderoom binary: ${CODEROOM_BIN}`)
console.error(`machine: ${cpus().length} CPUs (${cpus()[0]?.model ?? 'unknown'}), node ${process.version}`)
for (const n of clientCounts) {
  // Targets alternate within each repetition, so drifting background load hits both alike.
  for (let run = 1; run <= repeat; run++) {
    for (const target of targets) {
      console.error(`running ${target} with ${n} clients, ${ratePerClient} edits/s each, ${durationMs / 1000} s (run ${run}/${repeat}) ...`)
      const row = { ...(await runOne(target, n)), run }
      console.error(JSON.stringify(row))
      rows.push(row)
    }
  }
}
console.log(`\nMachine: ${cpus().length} CPUs (${cpus()[0]?.model ?? 'unknown'}), Node ${process.version}; load generator and server share it.`)
console.log(`Workload: ${ratePerClient} edits/s per client for ${durationMs / 1000} s (first ${warmupMs / 1000} s excluded from latency), one room, presence ${opts.presence ? 'on' : 'off'}, worker threads: ${maxWorkers}. Coderoom binary: ${CODEROOM_BIN.replace(/.*\/target\//, 'target/')}.\n`)
console.log(table(rows))
if (opts.json) writeFileSync(opts.json, JSON.stringify({ started, opts, coderoomBin: CODEROOM_BIN, rows }, null, 2))
const bad = rows.filter((r) => !r.converged)
if (bad.length) {
  console.error(`replicas did not converge for: ${bad.map((r) => `${r.target}/${r.clients}`).join(', ')}`)
  process.exitCode = 1
}
