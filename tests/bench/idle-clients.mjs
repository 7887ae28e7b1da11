// Idle npm y-websocket clients, as a browser tab leaves them: each a stock `WebsocketProvider`
// (its awareness on, as the library starts it), synced, then saying nothing but what the
// library says by itself (awareness renewals). One process holds one room's clients, as the
// density benchmark runs them (server/tests/density.rs, `idle_npm_clients`).
//
//   node idle-clients.mjs SERVER_URL ROOM COUNT [COOKIE ORIGIN]
//
// SERVER_URL and ROOM as `WebsocketProvider` takes them (Coderoom:
// `ws://HOST/api/rooms/ID` and `doc`; the reference server: `ws://HOST` and the room's name).
// COOKIE and ORIGIN, when given, go on every upgrade request, as a browser logged in sends
// them. Prints `ready N` once all N have synced, then holds them until stdin closes.

import { Y, WebsocketProvider, WebSocket } from '../node/lib/server.mjs'

const [url, room, countText, cookie, origin] = process.argv.slice(2)
const count = Number(countText)
if (!url || !room || !Number.isInteger(count) || count < 1) {
  console.error('usage: node idle-clients.mjs SERVER_URL ROOM COUNT [COOKIE ORIGIN]')
  process.exit(2)
}
// Each provider registers a process 'exit' listener.
process.setMaxListeners(0)

const headers = {}
// `Bearer TOKEN` in place of the cookie: the token as an Authorization header (to compare).
if (cookie?.startsWith('Bearer ')) headers.Authorization = cookie
else if (cookie) headers.Cookie = cookie
if (origin) headers.Origin = origin
// IDLE_SENDLOG=1: every 10 s, how many messages these clients sent, by size (the power of two
// at or above each), on stderr.
const sent = new Map()
class BrowserLikeWebSocket extends WebSocket {
  constructor (address, protocols) {
    super(address, protocols, { headers })
  }

  send (data, ...rest) {
    const size = 2 ** Math.ceil(Math.log2(data.length + 1))
    sent.set(size, (sent.get(size) || 0) + 1)
    return super.send(data, ...rest)
  }
}
if (process.env.IDLE_SENDLOG) {
  setInterval(() => {
    const bySize = [...sent].sort((a, b) => a[0] - b[0])
    console.error(`sent by ${count} clients of ${room}, [size, messages]: ${JSON.stringify(bySize)}`)
  }, 10_000).unref()
}

const providers = []
let synced = 0
const allSynced = new Promise((resolve) => {
  for (let i = 0; i < count; i++) {
    const provider = new WebsocketProvider(url, room, new Y.Doc(), {
      WebSocketPolyfill: BrowserLikeWebSocket,
      disableBc: true
    })
    // IDLE_AWARENESS=0: no presence at all (to compare).
    if (process.env.IDLE_AWARENESS === '0') provider.awareness.setLocalState(null)
    // IDLE_NO_ECHO=1: the provider sends its own presence only. A stock provider sends back
    // every presence update it receives (its 'update' handler answers remote changes too).
    if (process.env.IDLE_NO_ECHO) {
      const send = provider._awarenessUpdateHandler
      provider.awareness.off('update', send)
      provider.awareness.on('update', (changed, origin) => {
        if (origin === 'local') send(changed, origin)
      })
    }
    provider.once('sync', (isSynced) => {
      if (isSynced && ++synced === count) resolve()
    })
    providers.push(provider)
  }
})
const timer = setTimeout(() => {
  console.error(`only ${synced} of ${count} clients synced within 120 s`)
  process.exit(1)
}, 120_000)
await allSynced
clearTimeout(timer)
console.log(`ready ${count}`)
process.stdin.resume()
process.stdin.on('end', () => {
  for (const p of providers) p.destroy()
  process.exit(0)
})
