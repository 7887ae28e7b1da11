// One policy per act, whichever door (issue 37): the same principal through REST, the terminal
// socket and MCP (the official TypeScript SDK) gets the same decision and leaves the same audit
// entry (same action name, same decision). An agent in approval mode is asked on every door,
// Ctrl-O and pasted lines included, and a line waiting for its approval never runs; an agent
// that may not run commands cannot leave a readiness command behind; an agent's token makes no
// room; a viewer opening the terminal does not start the sandbox.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import WebSocket from 'ws'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { cleanups, createStorage, startServer, mintToken, api, createRoom, waitFor, skipUnless, freePort, joinByInvite } from './lib/server.mjs'

const HAVE_BWRAP = spawnSync('bwrap', ['--version'], { stdio: 'ignore' }).status === 0
const skip = skipUnless(HAVE_BWRAP, 'BWRAP', 'no bubblewrap: the sandbox tier these acts run in is missing (apt-get install bubblewrap)')

const text = (r) => r.content.map((c) => c.text ?? '').join('')

async function mcp (server, roomId, token) {
  const client = new Client({ name: 'coderoom-parity', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${server.url}/api/rooms/${roomId}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } }
  }))
  return client
}

/** The terminal socket as `token`, with every JSON event it is sent kept in `events`. */
async function terminal (server, roomId, token) {
  const ws = new WebSocket(`${server.url.replace(/^http/, 'ws')}/api/rooms/${roomId}/terminal`, { headers: { Authorization: `Bearer ${token}` } })
  const events = []
  ws.on('message', (data, binary) => { if (!binary) events.push(JSON.parse(data.toString())) })
  await new Promise((resolve, reject) => { ws.once('message', resolve); ws.once('error', reject) })
  return { ws, events }
}

/** The room's audit records by `actor` after `from` (a sequence number). */
async function recordsOf (server, token, roomId, actor, from) {
  const chain = (await api(server, token, 'GET', `/api/rooms/${roomId}/audit`)).body
  return chain.filter((r) => r.actor === actor && r.seq > from)
}

async function head (server, token, roomId) {
  const chain = (await api(server, token, 'GET', `/api/rooms/${roomId}/audit`)).body
  return chain.length ? chain[chain.length - 1].seq : 0
}

/** Waits for the records `actor` leaves after `from` to include `n` of `action`; their decisions. */
async function decisions (server, token, roomId, actor, from, action, n) {
  let found = []
  await waitFor(async () => {
    found = (await recordsOf(server, token, roomId, actor, from)).filter((r) => r.action === action)
    return found.length >= n
  }, 20_000, `fewer than ${n} ${action} records`, 100)
  return found.map((r) => r.decision)
}

async function pending (server, token, roomId) {
  const list = (await api(server, token, 'GET', `/api/rooms/${roomId}/approvals`)).body
  return list.filter((a) => a.state === 'pending')
}

test('each act gets one decision and one audit entry on every door', { skip, timeout: 240_000 }, async (t) => {
  const defer = cleanups(t)
  const storage = await createStorage('sqlite')
  defer(() => storage.cleanup())
  const previewPort = await freePort()
  const server = await startServer(storage, {
    extraArgs: ['--preview-url', `http://{id}.preview.localhost:${previewPort}`, '--preview-listen', `127.0.0.1:${previewPort}`]
  })
  defer(() => server.kill())
  const ana = await mintToken(storage, 'ana@example.com')
  const roomId = await createRoom(server, ana)
  const made = async (body) => {
    const r = await api(server, ana, 'POST', `/api/rooms/${roomId}/agents`, { ttl_s: 3600, ...body })
    assert.equal(r.status, 201, JSON.stringify(r.body))
    return r.body
  }
  const careful = await made({ name: 'careful', capabilities: ['observe', 'edit', 'type', 'publish', 'export'], approval_mode: true })
  const watcher = await made({ name: 'watcher', capabilities: ['observe'] })
  const inside = async (script) => (await api(server, ana, 'POST', `/api/rooms/${roomId}/exec`,
    { argv: ['sh', '-c', script], timeout_ms: 30000 })).body.stdout

  // Starting the sandbox: a viewer (the observe-only agent) opening the terminal or reading it
  // over MCP does not start it; asked directly, it is refused and recorded.
  const seen = await terminal(server, roomId, watcher.token)
  defer(() => seen.ws.close())
  await waitFor(async () => seen.events.some((e) => e.type === 'sandbox' && e.state === 'stopped'), 20_000, 'the viewer was not told the sandbox is stopped')
  const watcherMcp = await mcp(server, roomId, watcher.token)
  defer(() => watcherMcp.close())
  const read = await watcherMcp.callTool({ name: 'terminal_read', arguments: {} })
  assert.equal(read.isError, false, text(read))
  assert.notEqual((await api(server, ana, 'GET', `/api/rooms/${roomId}/sandbox`)).body.state, 'running',
    'a viewer started the sandbox')
  // Nor does reading a workspace file: the sandbox is found stopped.
  const read503 = await fetch(`${server.url}/api/rooms/${roomId}/files/notes.txt`, { headers: { Authorization: `Bearer ${watcher.token}` } })
  assert.equal(read503.status, 503)
  assert.notEqual((await api(server, ana, 'GET', `/api/rooms/${roomId}/sandbox`)).body.state, 'running',
    'a viewer\'s file read started the sandbox')
  let from = await head(server, ana, roomId)
  assert.equal((await api(server, watcher.token, 'POST', `/api/rooms/${roomId}/sandbox/start`)).status, 403)
  assert.deepEqual(await decisions(server, ana, roomId, watcher.agent_id, from, 'type', 1), ['deny'])

  // Running a command, refused alike: REST and MCP leave one `run_command` refusal each.
  from = await head(server, ana, roomId)
  assert.equal((await api(server, watcher.token, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['true'] })).status, 403)
  const refusedMcp = await watcherMcp.callTool({ name: 'exec', arguments: { argv: ['true'] } })
  assert.equal(refusedMcp.isError, true)
  assert.match(text(refusedMcp), /refused: missing capability type/)
  assert.deepEqual(await decisions(server, ana, roomId, watcher.agent_id, from, 'run_command', 2), ['deny', 'deny'])

  // Typing a line, refused alike: the socket and MCP leave one `type` refusal each.
  from = await head(server, ana, roomId)
  seen.ws.send(Buffer.from('touch watcher-typed\r'))
  await waitFor(async () => seen.events.some((e) => e.type === 'denied'), 20_000, 'the socket did not refuse the keys')
  const typedMcp = await watcherMcp.callTool({ name: 'terminal_send', arguments: { text: 'touch watcher-typed\n', wait_ms: 0 } })
  assert.equal(typedMcp.isError, true)
  assert.deepEqual(await decisions(server, ana, roomId, watcher.agent_id, from, 'type', 2), ['deny', 'deny'])

  // Writing a file, refused alike: REST and MCP leave one `edit` refusal each.
  from = await head(server, ana, roomId)
  const put = await fetch(`${server.url}/api/rooms/${roomId}/files/notes.txt`, { method: 'PUT', body: 'no', headers: { Authorization: `Bearer ${watcher.token}` } })
  assert.equal(put.status, 403)
  const wroteMcp = await watcherMcp.callTool({ name: 'write_file', arguments: { path: 'notes.txt', content: 'no' } })
  assert.equal(wroteMcp.isError, true)
  assert.match(text(wroteMcp), /refused: missing capability edit/)
  assert.deepEqual(await decisions(server, ana, roomId, watcher.agent_id, from, 'edit', 2), ['deny', 'deny'])

  // Publishing a preview, refused alike: one `publish` refusal each.
  from = await head(server, ana, roomId)
  const preview = { port: 8000, visibility: 'room', ttl_s: 600 }
  assert.equal((await api(server, watcher.token, 'POST', `/api/rooms/${roomId}/previews`, preview)).status, 403)
  const previewMcp = await watcherMcp.callTool({ name: 'request_preview', arguments: preview })
  assert.equal(previewMcp.isError, true)
  assert.deepEqual(await decisions(server, ana, roomId, watcher.agent_id, from, 'publish', 2), ['deny', 'deny'])

  // Exporting, refused alike: one `export` refusal each.
  from = await head(server, ana, roomId)
  const exported = { files: ['notes.txt'] }
  assert.equal((await api(server, watcher.token, 'POST', `/api/rooms/${roomId}/exports`, exported)).status, 403)
  const exportMcp = await watcherMcp.callTool({ name: 'export_files', arguments: exported })
  assert.equal(exportMcp.isError, true)
  assert.match(text(exportMcp), /refused: missing capability export/)
  assert.deepEqual(await decisions(server, ana, roomId, watcher.agent_id, from, 'export', 2), ['deny', 'deny'])

  // A readiness step is a command: refused to an agent that may not run commands.
  from = await head(server, ana, roomId)
  const ready = await api(server, watcher.token, 'PUT', `/api/rooms/${roomId}/readiness`, { command: 'touch readied' })
  assert.equal(ready.status, 403)
  assert.deepEqual(await decisions(server, ana, roomId, watcher.agent_id, from, 'set_readiness', 1), ['deny'])

  // An agent's token makes no room, neither a new one nor a fork.
  assert.equal((await api(server, careful.token, 'POST', '/api/rooms', { name: 'mine' })).status, 403)
  from = await head(server, ana, roomId)
  const fork = await api(server, careful.token, 'POST', `/api/rooms/${roomId}/fork`, { name: 'agent fork' })
  assert.equal(fork.status, 403, JSON.stringify(fork.body))
  assert.match(fork.body.error, /an agent cannot make rooms/)
  assert.deepEqual(await decisions(server, ana, roomId, careful.agent_id, from, 'fork', 1), ['deny'])

  // An agent in approval mode is asked on every door, and nothing runs meanwhile.
  await api(server, ana, 'POST', `/api/rooms/${roomId}/sandbox/start`)
  from = await head(server, ana, roomId)
  const rest = await api(server, careful.token, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['touch', 'by-rest'] })
  assert.equal(rest.status, 202)
  const carefulMcp = await mcp(server, roomId, careful.token)
  defer(() => carefulMcp.close())
  const viaMcp = await carefulMcp.callTool({ name: 'exec', arguments: { argv: ['touch', 'by-mcp'], wait_s: 0 } })
  assert.equal(viaMcp.isError, true)
  assert.match(text(viaMcp), /approval/)
  const term = await terminal(server, roomId, careful.token)
  defer(() => term.ws.close())
  const waits = () => term.events.filter((e) => e.type === 'floor_refused' && /waits for approval/.test(e.reason)).length
  term.ws.send(Buffer.from('touch by-enter\r'))
  await waitFor(async () => waits() >= 1, 20_000, 'Enter did not wait for an approval')
  term.ws.send(Buffer.from('touch by-ctrl-o\x0f'))
  await waitFor(async () => waits() >= 2, 20_000, 'Ctrl-O did not wait for an approval')
  term.ws.send(Buffer.from('\x1b[200~touch by-paste\n\x1b[201~\r'))
  await waitFor(async () => waits() >= 3, 20_000, 'a bracketed paste did not wait for an approval')
  term.ws.send(Buffer.from('touch by-ctrl-j\n'))
  await waitFor(async () => waits() >= 4, 20_000, 'Ctrl-J did not wait for an approval')
  const asked = await decisions(server, ana, roomId, careful.agent_id, from, 'run_command', 6)
  assert.deepEqual(asked, Array(6).fill('needs_approval'))
  assert.equal((await pending(server, ana, roomId)).filter((a) => a.action === 'run_command').length, 6)
  // A public preview waits on both doors, recorded as one act.
  from = await head(server, ana, roomId)
  const publicPreview = { port: 8000, visibility: 'public', ttl_s: 600 }
  const restPreview = await api(server, careful.token, 'POST', `/api/rooms/${roomId}/previews`, publicPreview)
  assert.equal(restPreview.status, 201)
  assert.equal(restPreview.body.state, 'pending_approval')
  const mcpPreview = await carefulMcp.callTool({ name: 'request_preview', arguments: { ...publicPreview, wait_s: 0 } })
  assert.equal(mcpPreview.isError, true)
  assert.match(text(mcpPreview), /no decision yet/)
  const previewRecords = (await recordsOf(server, ana, roomId, careful.agent_id, from)).filter((r) => r.action === 'public_preview')
  assert.deepEqual(previewRecords.map((r) => r.decision), ['needs_approval', 'allow', 'needs_approval', 'allow'])
  assert.ok(previewRecords.every((r) => r.action === 'public_preview'))
  // An export waits for someone else's approval on both doors, recorded as one act; once
  // approved, it is spent by the door that presents it, once.
  const wrote = await carefulMcp.callTool({ name: 'write_file', arguments: { path: 'notes.txt', content: 'for the record\n' } })
  assert.equal(wrote.isError, false, text(wrote))
  from = await head(server, ana, roomId)
  const restExport = await api(server, careful.token, 'POST', `/api/rooms/${roomId}/exports`, exported)
  assert.equal(restExport.status, 202, JSON.stringify(restExport.body))
  const mcpExport = await carefulMcp.callTool({ name: 'export_files', arguments: { ...exported, wait_s: 0 } })
  assert.equal(mcpExport.isError, true)
  assert.match(text(mcpExport), /no decision yet/)
  assert.deepEqual(await decisions(server, ana, roomId, careful.agent_id, from, 'export', 2), ['needs_approval', 'needs_approval'])
  const exportAsk = (await pending(server, ana, roomId)).find((a) => a.action === 'export')
  assert.ok(exportAsk, 'no pending approval for the export')
  // Decided by another owner: the agent's sponsor is not someone else to its own agent.
  const ben = await joinByInvite(server, storage, roomId, ana, 'ben@example.com', 'owner')
  assert.equal((await api(server, ben.token, 'POST', `/api/rooms/${roomId}/approvals/${exportAsk.id}/decision`, { approve: true })).status, 200)
  from = await head(server, ana, roomId)
  const approvedMcp = await carefulMcp.callTool({ name: 'export_files', arguments: { ...exported, approval_id: exportAsk.id } })
  assert.equal(approvedMcp.isError, false, text(approvedMcp))
  assert.deepEqual(JSON.parse(text(approvedMcp)), { files: { 'notes.txt': 'for the record\n' } })
  const spent = await api(server, careful.token, 'POST', `/api/rooms/${roomId}/exports`, { ...exported, approval_id: exportAsk.id })
  assert.equal(spent.status, 403, 'an approval was spent twice: ' + JSON.stringify(spent.body))
  assert.match(spent.body.error, /used/, JSON.stringify(spent.body))
  assert.deepEqual(await decisions(server, ana, roomId, careful.agent_id, from, 'export', 2), ['allow', 'deny'])
  // The readiness step waits the same way.
  assert.equal((await api(server, careful.token, 'PUT', `/api/rooms/${roomId}/readiness`, { command: 'touch readied' })).status, 202)
  assert.equal(await inside('ls by-* readied 2>/dev/null; echo none'), 'none\n', 'something ran without its approval')

  // Approved, the line typed again runs, once, and is recorded as the same act.
  const line = (await pending(server, ana, roomId)).find((a) => a.params.terminal === 'touch by-enter\r')
  assert.ok(line, 'no pending approval for the typed line')
  assert.equal((await api(server, ana, 'POST', `/api/rooms/${roomId}/approvals/${line.id}/decision`, { approve: true })).status, 200)
  from = await head(server, ana, roomId)
  term.ws.send(Buffer.from('touch by-enter\r'))
  await waitFor(async () => (await inside('ls by-enter 2>/dev/null; echo none')) === 'by-enter\nnone\n', 20_000, 'the approved line never ran')
  assert.deepEqual(await decisions(server, ana, roomId, careful.agent_id, from, 'run_command', 1), ['allow'])
})
