// Graceful shutdown with clients connected: the server exits 0 and keeps every acknowledged edit
// (covered by convergence.test.mjs), and it tells connected clients why they are cut off with a
// 1001 "server shutting down" close frame (room.rs `finish`).

import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  BACKENDS, cleanups, createStorage, mintToken, startServer, createRoom, openProvider, waitSynced, waitFor, destroyAll, Y
} from './lib/server.mjs'
import { editLoop } from './lib/edits.mjs'

const CYCLES = 3
const CLIENTS = 6


for (const backend of BACKENDS) {
  test(`clients connected at SIGTERM receive a 1001 close frame (${backend.kind})`,
    { timeout: 120_000, skip: backend.skip }, async (t) => {
      const defer = cleanups(t)
      const storage = await createStorage(backend.kind)
      defer(() => storage.cleanup())
      const token = await mintToken(storage)
      const seen = []
      for (let cycle = 0; cycle < CYCLES; cycle++) {
        const server = await startServer(storage, { extraArgs: ['--compact-every', '100'] })
        defer(() => server.kill())
        const roomId = await createRoom(server, token, `shutdown ${cycle}`)
        const clients = Array.from({ length: CLIENTS }, () => openProvider(server, roomId, token))
        defer(() => destroyAll(clients))
        await Promise.all(clients.map((c) => waitSynced(c.provider)))
        // Some concurrent editing first, so the room has a log to compact at shutdown.
        clients[0].doc.getMap('files').set('main.txt', new Y.Text('hello'))
        await waitFor(() => clients.every((c) => c.doc.getMap('files').has('main.txt')), 10_000, 'edit did not propagate')
        await Promise.all(clients.map((c, i) => editLoop(c.doc, { seed: cycle * 100 + i, ops: 60, maxGapMs: 6 })))
        assert.deepEqual(await server.stop(), { code: 0, signal: null }, server.logs())
        await waitFor(() => clients.every((c) => c.provider.closeEvents.length > 0), 10_000,
          'clients did not notice the shutdown')
        destroyAll(clients)
        seen.push(...clients.map((c) => `${c.provider.closeEvents[0].code} ${c.provider.closeEvents[0].reason}`))
      }
      const tally = {}
      for (const s of seen) tally[s] = (tally[s] || 0) + 1
      t.diagnostic(`close frames seen: ${JSON.stringify(tally)}`)
      assert.deepEqual(tally, { '1001 server shutting down': CYCLES * CLIENTS })
    })
}
