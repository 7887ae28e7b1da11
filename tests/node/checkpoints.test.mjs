// Checkpoint and rollback with stock y-websocket clients: after a restore, every connected
// client's files read as at the checkpoint, live (no reconnect), and so does the workspace on
// disk. A rollback is an ordinary update with minimal edits: a collaborator's cursor before the
// rolled-back text stays where it was.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { roomScene, syncedProviders, waitFor, serverFiles, filesJson, api, Y } from './lib/server.mjs'

test('a restore reaches every connected client live, and the workspace', { timeout: 120_000 }, async (t) => {
  const scene = await roomScene(t)
  const { token, server, roomId } = scene
  const [a, b] = await syncedProviders(scene, 2)

  const files = a.doc.getMap('files')
  a.doc.transact(() => {
    files.set('notes.md', new Y.Text('# Plan\nship it\n'))
    files.set('src/app.js', new Y.Text('console.log("v1")\n'))
  })
  const then = { 'notes.md': '# Plan\nship it\n', 'src/app.js': 'console.log("v1")\n' }
  await waitFor(async () => JSON.stringify(await serverFiles(server, roomId, token)) === JSON.stringify(then),
    15_000, 'the files did not reach the server')
  const exec = async (script) => (await api(server, token, 'POST', `/api/rooms/${roomId}/exec`,
    { argv: ['sh', '-c', script], timeout_ms: 30_000 })).body
  await waitFor(async () => (await exec('cat src/app.js')).stdout === then['src/app.js'], 15_000,
    'the files did not reach the workspace')

  const cp = await api(server, token, 'POST', `/api/rooms/${roomId}/checkpoints`, { name: 'v1' })
  assert.equal(cp.status, 201, JSON.stringify(cp.body))

  // Changes from both sides: the editor and a command inside.
  a.doc.transact(() => {
    files.get('notes.md').insert('# Plan\n'.length, 'rewrite everything\n')
    files.delete('src/app.js')
    files.set('scratch.txt', new Y.Text('tmp'))
  })
  assert.equal((await exec('echo built > out.txt && echo ok')).stdout, 'ok\n')
  await waitFor(() => filesJson(b.doc)['out.txt'] === 'built\n' && !('src/app.js' in filesJson(b.doc)),
    15_000, () => `b never saw the changes: ${JSON.stringify(filesJson(b.doc))}`)
  // b's cursor sits in "# Pl|an", before the rolled-back text.
  const cursor = Y.createRelativePositionFromTypeIndex(b.doc.getMap('files').get('notes.md'), 4)

  const restored = await api(server, token, 'POST', `/api/rooms/${roomId}/checkpoints/${cp.body.id}/restore`)
  assert.equal(restored.status, 200, JSON.stringify(restored.body))
  for (const [name, c] of [['a', a], ['b', b]]) {
    await waitFor(() => JSON.stringify(filesJson(c.doc)) === JSON.stringify(then), 15_000,
      () => `${name} reads ${JSON.stringify(filesJson(c.doc))}`)
  }
  assert.equal(a.provider.wsconnected && b.provider.wsconnected, true, 'a client was disconnected')
  const at = Y.createAbsolutePositionFromRelativePosition(cursor, b.doc)
  assert.equal(at?.index, 4, 'the cursor moved')
  assert.equal((await exec('ls; cat notes.md src/app.js')).stdout,
    'notes.md\nsrc\n# Plan\nship it\nconsole.log("v1")\n')
  assert.deepEqual(await server.stop(), { code: 0, signal: null })
})
