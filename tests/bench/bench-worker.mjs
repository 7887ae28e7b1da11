// One load-generator thread of ydoc-bench.mjs: runs some of the benchmark's y-websocket clients.
//
// Each client edits `files/bench.txt` at a steady rate, inserting a small marker
// "⟨client:seq:timestamp⟩" at a random position. Every client observes remote inserts, parses
// the markers, and records now - timestamp: the edit-to-peer latency (wall clock shared by all
// threads of the process: performance.timeOrigin + performance.now()).

import { parentPort, workerData } from 'node:worker_threads'
import { performance } from 'node:perf_hooks'
import { createHash } from 'node:crypto'
import { Y, WebsocketProvider, WebSocket, authedWebSocket, waitFor, withTimeout } from '../node/lib/server.mjs'

// Each provider registers a process 'exit' listener.
process.setMaxListeners(0)

const now = () => performance.timeOrigin + performance.now()
const MARKER = /⟨(\d+):(\d+):(\d+\.\d+)⟩/g

const { docBase, token, clientIds, ratePerClient, totalClients, seed, presence } = workerData
let rand = seed >>> 0
const random = () => {
  // xorshift32: cheap and deterministic per worker.
  rand ^= rand << 13; rand >>>= 0
  rand ^= rand >>> 17
  rand ^= rand << 5; rand >>>= 0
  return rand / 4294967296
}

const clients = clientIds.map((id) => {
  const doc = new Y.Doc()
  const provider = new WebsocketProvider(docBase, 'doc', doc, {
    WebSocketPolyfill: token ? authedWebSocket(token) : WebSocket,
    disableBc: true
  })
  if (presence) {
    provider.awareness.setLocalStateField('user', { name: `bench-${id}` })
  } else {
    // No presence traffic at all: the socket is not open yet, so nothing is sent.
    provider.awareness.setLocalState(null)
  }
  const c = { id, doc, provider, sent: 0, observed: 0, latencies: [], closes: [], warmupUntil: Infinity }
  provider.on('connection-close', (e) => { if (e) c.closes.push(`${e.code} ${e.reason}`) })
  return c
})

function attach (c) {
  c.text = c.doc.getMap('files').get('bench.txt')
  // Read the markers straight from each remote update (cheap, proportional to the update) rather
  // than from the text event's delta, which walks the whole text on every event and would make
  // the load generator, not the server, the bottleneck.
  c.doc.on('update', (update, _origin, _doc, transaction) => {
    if (transaction.local) return
    const t = now()
    for (const struct of Y.decodeUpdate(update).structs) {
      const str = struct.content?.str
      if (typeof str !== 'string') continue
      for (const m of str.matchAll(MARKER)) {
        // Every marker in the text comes from a measured edit (the file starts empty).
        const ts = Number(m[3])
        c.observed++
        if (ts >= c.warmupUntil) c.latencies.push(t - ts)
      }
    }
  })
}

function edit (c) {
  const len = c.text.length
  const pos = Math.floor(random() * (len + 1))
  c.text.insert(pos, `⟨${c.id}:${c.sent}:${now().toFixed(3)}⟩`)
  c.sent++
}

async function main () {
  await withTimeout(Promise.all(clients.map((c) => waitFor(() => c.provider.synced && c.doc.getMap('files').get('bench.txt') instanceof Y.Text,
    30_000, `client ${c.id} did not sync`))), 35_000, 'clients did not sync')
  clients.forEach(attach)
  parentPort.postMessage({ type: 'ready' })

  const start = await nextMessage('start')
  const period = 1000 / ratePerClient
  const timers = []
  for (const c of clients) {
    c.warmupUntil = start.warmupUntil
    // Stagger clients evenly over one period; then fire every period, never in bursts: a
    // generator that falls behind sends less, and the report shows the achieved rate.
    let due = start.startAt + (period * c.id) / totalClients
    const tick = () => {
      if (now() >= start.stopAt) return
      edit(c)
      due = Math.max(due + period, now())
      timers.push(setTimeout(tick, Math.max(0, due - now())))
    }
    timers.push(setTimeout(tick, Math.max(0, due - now())))
  }
  await new Promise((resolve) => setTimeout(resolve, Math.max(0, start.stopAt - now() + 5)))
  timers.forEach(clearTimeout)
  parentPort.postMessage({ type: 'sent', sent: clients.map((c) => ({ id: c.id, sent: c.sent })) })

  // Wait until every client saw every other client's edits, or the drain timeout.
  const { totalSent, drainMs } = await nextMessage('expect')
  const expected = (c) => totalSent - c.sent
  try {
    await waitFor(() => clients.every((c) => c.observed >= expected(c)), drainMs, 'drain')
  } catch {}
  const drainedAt = now()
  parentPort.postMessage({
    type: 'result',
    drainedAt,
    clients: clients.map((c) => ({
      id: c.id,
      sent: c.sent,
      observed: c.observed,
      expected: expected(c),
      closes: c.closes,
      length: c.text.length,
      hash: createHash('sha256').update(c.text.toString()).digest('hex').slice(0, 16)
    })),
    latencies: Float64Array.from(clients.flatMap((c) => c.latencies))
  })
  await nextMessage('exit')
  for (const c of clients) {
    c.provider.destroy()
    c.provider.awareness.destroy()
    c.doc.destroy()
  }
  parentPort.close()
}

const inbox = []
const waiting = []
parentPort.on('message', (m) => {
  const i = waiting.findIndex((w) => w.type === m.type)
  if (i >= 0) waiting.splice(i, 1)[0].resolve(m)
  else inbox.push(m)
})
function nextMessage (type) {
  const i = inbox.findIndex((m) => m.type === type)
  if (i >= 0) return Promise.resolve(inbox.splice(i, 1)[0])
  return new Promise((resolve) => waiting.push({ type, resolve }))
}

main().catch((e) => {
  parentPort.postMessage({ type: 'error', message: e.stack || String(e) })
})
