// Renames lose nobody's edits, with stock y-websocket clients: one client renames a file (the
// only way a Yjs client can: a new text under the new key, the old key deleted, in one
// transaction) while another types into it without having seen the rename, either at the same
// moment or offline. Every character typed by both ends up in the new file, on both clients and
// on the server. Also a deletion while someone types.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { roomScene, syncedProviders, waitFor, serverFiles, filesJson, Y } from './lib/server.mjs'

function rename (doc, from, to) {
  const files = doc.getMap('files')
  doc.transact(() => {
    files.set(to, new Y.Text(files.get(from).toString()))
    files.delete(from)
  })
}

async function setup (t) {
  const scene = await roomScene(t)
  const [renamer, typist] = await syncedProviders(scene, 2)
  const { server, roomId, token } = scene
  return { server, roomId, token, renamer, typist }
}

async function converge (s, clients, want) {
  await waitFor(async () => JSON.stringify(await serverFiles(s.server, s.roomId, s.token)) === JSON.stringify(want),
    15_000, `the server never held ${JSON.stringify(want)}`)
  for (const c of clients) {
    await waitFor(() => JSON.stringify(filesJson(c.doc)) === JSON.stringify(want), 15_000,
      `a client never held ${JSON.stringify(want)}; it has ${JSON.stringify(filesJson(c.doc))}`)
  }
}

test('a rename and typing at the same moment: both are in the new file', { timeout: 60_000 }, async (t) => {
  const s = await setup(t)
  const { renamer, typist } = s
  renamer.doc.getMap('files').set('a.txt', new Y.Text('hello world'))
  await waitFor(() => typist.doc.getMap('files').get('a.txt')?.toString() === 'hello world', 10_000, 'the file did not reach the typist')
  // Same tick: each sends before it can receive the other's change.
  const text = typist.doc.getMap('files').get('a.txt')
  text.insert(5, ', dear')
  rename(renamer.doc, 'a.txt', 'b.txt')
  text.insert(17, '!')
  await converge(s, [renamer, typist], { 'b.txt': 'hello, dear world!' })
})

test('an offline typist reconnecting after a rename and a folder rename keeps every edit', { timeout: 60_000 }, async (t) => {
  const s = await setup(t)
  const { renamer, typist } = s
  const files = renamer.doc.getMap('files')
  files.set('a.txt', new Y.Text('one two'))
  files.set('src/x.js', new Y.Text('x()'))
  files.set('src/y.js', new Y.Text('y()'))
  await waitFor(() => typist.doc.getMap('files').size === 3, 10_000, 'the files did not reach the typist')
  typist.provider.disconnect()
  const mine = typist.doc.getMap('files')
  mine.get('a.txt').insert(3, ' and a half')
  mine.get('src/x.js').insert(2, '1')
  mine.get('src/y.js').insert(2, '2')
  mine.get('a.txt').insert(0, '> ')
  rename(renamer.doc, 'a.txt', 'b.txt')
  renamer.doc.transact(() => {
    for (const f of ['x.js', 'y.js']) {
      files.set(`lib/${f}`, new Y.Text(files.get(`src/${f}`).toString()))
      files.delete(`src/${f}`)
    }
  })
  files.get('b.txt').insert(7, '.')
  await waitFor(async () => 'lib/y.js' in await serverFiles(s.server, s.roomId, s.token), 10_000, 'the renames did not land')
  typist.provider.connect()
  await converge(s, [renamer, typist], { 'b.txt': '> one and a half two.', 'lib/x.js': 'x(1)', 'lib/y.js': 'y(2)' })
})

test('typing into a file someone deletes brings it back', { timeout: 60_000 }, async (t) => {
  const s = await setup(t)
  const { renamer, typist } = s
  renamer.doc.getMap('files').set('notes.md', new Y.Text('keep'))
  await waitFor(() => typist.doc.getMap('files').get('notes.md')?.toString() === 'keep', 10_000, 'the file did not reach the typist')
  typist.doc.getMap('files').get('notes.md').insert(4, ' this')
  renamer.doc.getMap('files').delete('notes.md')
  await converge(s, [renamer, typist], { 'notes.md': 'keep this' })
  // Deleted by someone who has seen everything in it: it stays deleted.
  renamer.doc.getMap('files').delete('notes.md')
  await converge(s, [renamer, typist], {})
  assert.deepEqual(renamer.provider.closeEvents, [])
})
