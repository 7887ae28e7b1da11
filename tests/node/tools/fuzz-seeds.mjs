// Writes the fuzzing seed corpus (server/fuzz/seeds/): well-formed y-websocket frames of
// every kind the server takes, made by the real npm yjs and y-protocols, so the fuzzer starts
// from inputs that reach deep into the inbound path instead of rediscovering the framing.
//
//   cd tests/node && node tools/fuzz-seeds.mjs
//
// Both targets (inbound_frame, room_apply) take one WebSocket frame's bytes, so they share it.
import { mkdirSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import * as Y from 'yjs'
import * as syncProtocol from 'y-protocols/sync'
import * as awarenessProtocol from 'y-protocols/awareness'
import * as encoding from 'lib0/encoding'

const out = join(dirname(fileURLToPath(import.meta.url)), '../../../server/fuzz/seeds')
mkdirSync(out, { recursive: true })
const MESSAGE_SYNC = 0
const MESSAGE_AWARENESS = 1
const MESSAGE_AUTH = 2
const MESSAGE_QUERY_AWARENESS = 3

function frame (type, write) {
  const e = encoding.createEncoder()
  encoding.writeVarUint(e, type)
  write(e)
  return encoding.toUint8Array(e)
}

const seeds = {}
const doc = new Y.Doc()
doc.clientID = 1
const files = doc.getMap('files')
const text = new Y.Text()
files.set('src/main.rs', text)
text.insert(0, 'fn main() {\n    println!("hi");\n}\n')
const afterFirst = Y.encodeStateVector(doc)
text.delete(3, 4)
text.insert(3, 'start', { bold: true })
doc.getText('notes').insert(0, 'plain text at the root ✓ with UTF-8')
doc.getArray('list').push([1, 'two', { three: 3 }, new Uint8Array([4])])
const whole = Y.encodeStateAsUpdate(doc)
const tail = Y.encodeStateAsUpdate(doc, afterFirst)

seeds['sync-step1-empty'] = frame(MESSAGE_SYNC, (e) => syncProtocol.writeSyncStep1(e, new Y.Doc()))
seeds['sync-step1'] = frame(MESSAGE_SYNC, (e) => syncProtocol.writeSyncStep1(e, doc))
seeds['sync-step2'] = frame(MESSAGE_SYNC, (e) => syncProtocol.writeSyncStep2(e, doc))
seeds['update-whole'] = frame(MESSAGE_SYNC, (e) => syncProtocol.writeUpdate(e, whole))
seeds['update-tail'] = frame(MESSAGE_SYNC, (e) => syncProtocol.writeUpdate(e, tail))

// Two clients editing one text concurrently: the update carries conflicting items.
const a = new Y.Doc(); a.clientID = 2
const b = new Y.Doc(); b.clientID = 3
a.getText('t').insert(0, 'aaaa'); b.getText('t').insert(0, 'bbbb')
Y.applyUpdate(a, Y.encodeStateAsUpdate(b))
a.getText('t').insert(4, 'middle')
seeds['update-concurrent'] = frame(MESSAGE_SYNC, (e) => syncProtocol.writeUpdate(e, Y.encodeStateAsUpdate(a)))

const aw = new awarenessProtocol.Awareness(doc)
aw.setLocalState({ user: { name: 'ana', color: '#ff0000' }, cursor: { anchor: 3, head: 7 } })
seeds['awareness'] = frame(MESSAGE_AWARENESS, (e) =>
  encoding.writeVarUint8Array(e, awarenessProtocol.encodeAwarenessUpdate(aw, [doc.clientID])))
aw.setLocalState(null)
seeds['awareness-removal'] = frame(MESSAGE_AWARENESS, (e) =>
  encoding.writeVarUint8Array(e, awarenessProtocol.encodeAwarenessUpdate(aw, [doc.clientID])))
seeds['query-awareness'] = frame(MESSAGE_QUERY_AWARENESS, () => {})
seeds['auth'] = frame(MESSAGE_AUTH, (e) => { encoding.writeVarUint(e, 0); encoding.writeVarString(e, 'permission denied') })
// Several messages in one frame, as the server accepts them.
seeds['batch'] = new Uint8Array([...seeds['sync-step1'], ...seeds['update-tail'], ...seeds['awareness']])

aw.destroy() // it keeps a timer that would hold the process open
for (const [name, bytes] of Object.entries(seeds)) writeFileSync(join(out, name), bytes)
console.log(`wrote ${Object.keys(seeds).length} seeds to ${out}`)
