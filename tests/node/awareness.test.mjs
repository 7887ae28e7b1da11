// Presence (awareness) with real y-websocket clients.
//
// The stock y-websocket client re-sends every awareness change it receives, including other
// clients' states, to the server (its awareness 'update' handler broadcasts added, updated and
// removed clients whatever the origin). A server that serves stock clients has to tolerate those
// relays; the reference server applies them like any other update.
//
// Presence is handled the same way whatever the storage, so these run on SQLite only.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  cleanups, roomScene, startReferenceServer, openProvider, waitSynced, waitFor, destroyAll, sleep
} from './lib/server.mjs'


/** The scenario, against either server; `server`, `roomId`, `token` come from the caller. */
async function presenceScenario (defer, server, roomId, token) {
  const clients = [0, 1, 2].map(() => openProvider(server, roomId, token))
  defer(() => destroyAll(clients))
  await Promise.all(clients.map((c) => waitSynced(c.provider)))

  const [a, b, c] = clients
  a.provider.awareness.setLocalStateField('user', { name: 'ana', cursor: 1 })
  const aId = a.doc.clientID
  const seesA = (p, cursor) => p.provider.awareness.getStates().get(aId)?.user?.cursor === cursor
  const closes = () => JSON.stringify(clients.map((x) => x.provider.closeEvents))
  await waitFor(() => seesA(b, 1) && seesA(c, 1), 5_000, () => `peers did not see the presence state; closes: ${closes()}`)
  // A few more presence changes, as a moving cursor makes.
  for (let i = 2; i <= 5; i++) {
    a.provider.awareness.setLocalStateField('user', { name: 'ana', cursor: i })
    await sleep(50)
  }
  await waitFor(() => seesA(b, 5) && seesA(c, 5), 10_000, () => `peers did not follow the presence changes; closes: ${closes()}`)
  // A fence instead of a pause: every client now sets one more field, and each must see every
  // other's. A server handles a connection's frames in order, so one that closed a connection
  // for what it sent before could not pass the fence on.
  for (const x of clients) x.provider.awareness.setLocalStateField('fence', true)
  const fenced = () => clients.every((x) => clients.every((y) =>
    x.provider.awareness.getStates().get(y.doc.clientID)?.fence === true))
  await waitFor(fenced, 10_000, () => `the fence did not reach every peer; closes: ${closes()}`)
  assert.deepEqual(clients.map((x) => x.provider.closeEvents), [[], [], []], 'no connection may be closed while presence changes')

  // A leaving client's presence disappears for the others.
  destroyAll([a])
  await waitFor(() => !b.provider.awareness.getStates().has(aId) && !c.provider.awareness.getStates().has(aId),
    10_000, 'presence of a departed client was not removed')
  destroyAll(clients)
}

test('presence reaches every peer and nobody is disconnected for relaying it',
  { timeout: 60_000 }, async (t) => {
    const { defer, token, server, roomId } = await roomScene(t)
    await presenceScenario(defer, server, roomId, token)
    assert.deepEqual(await server.stop(), { code: 0, signal: null })
  })

test('control: the same presence scenario passes on the reference y-websocket server',
  { timeout: 60_000 }, async (t) => {
    const defer = cleanups(t)
    const server = await startReferenceServer()
    defer(() => server.kill())
    await presenceScenario(defer, server, 'presence-control', 'unused')
  })
