// Agents over MCP with real clients: the official Python SDK (`mcp` from PyPI) and the official
// TypeScript SDK (`@modelcontextprotocol/sdk`) connect to /api/rooms/{id}/mcp with an agent's
// token. The Python one lists the tools and writes a file; a y-websocket client in the room sees
// the edit arrive, the agent in presence with a cursor, and the audit names the agent and its
// sponsor. The TypeScript one edits around a person's concurrent typing, runs a command, and an
// observe-only agent is refused (a readable tool error, audited).

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, spawnSync } from 'node:child_process'
import { promisify } from 'node:util'
import { fileURLToPath } from 'node:url'
import WebSocket from 'ws'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { cleanups, createStorage, startServer, mintToken, api, createRoom, openProvider, waitSynced, waitFor, skipUnless, freePort, joinByInvite, Y } from './lib/server.mjs'

const run = promisify(execFile)
const PY_CLIENT = fileURLToPath(new URL('../python/mcp_client.py', import.meta.url))
const PYTHON = process.env.CODEROOM_PYTHON || 'python3'
const HAVE_MCP = spawnSync(PYTHON, ['-c', 'import mcp.client.streamable_http'], { stdio: 'ignore' }).status === 0
const skip = skipUnless(HAVE_MCP, 'PYTHON_MCP', `no Python MCP SDK for ${PYTHON} (python3 -m pip install 'mcp==2.3.0')`)

/** Runs the Python SDK's client with `calls`; its JSON answer. */
async function python (url, token, calls) {
  const { stdout } = await run(PYTHON, [PY_CLIENT, url, token, JSON.stringify(calls)], { timeout: 60_000 })
  return JSON.parse(stdout.trim().split('\n').pop())
}

async function tsClient (url, token) {
  const client = new Client({ name: 'coderoom-test', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } }
  }))
  return client
}

const text = (r) => r.content.map((c) => c.text ?? '').join('')

/** A server on fresh storage and a room Ana owns, all torn down with the test. */
async function anasRoom (t, serverOpts = {}) {
  const defer = cleanups(t)
  const storage = await createStorage('sqlite')
  defer(() => storage.cleanup())
  const server = await startServer(storage, serverOpts)
  defer(() => server.kill())
  const ana = await mintToken(storage, 'ana@example.com')
  const roomId = await createRoom(server, ana)
  return { defer, storage, server, ana, roomId }
}

/** The room's terminal socket as `token`, once the server has said something on it (it joins
 *  the terminal first, so the connection is in the room by then). */
async function terminal (server, roomId, token) {
  const ws = new WebSocket(`${server.url.replace(/^http/, 'ws')}/api/rooms/${roomId}/terminal`, { headers: { Authorization: `Bearer ${token}` } })
  await new Promise((resolve, reject) => { ws.once('message', resolve); ws.once('error', reject) })
  return ws
}

test('agents work in the room through real MCP clients, seen live and audited', { skip, timeout: 180_000 }, async (t) => {
  const { defer, server, ana, roomId } = await anasRoom(t)
  const made = await api(server, ana, 'POST', `/api/rooms/${roomId}/agents`,
    { name: 'helper', capabilities: ['observe', 'edit', 'type'], ttl_s: 3600 })
  assert.equal(made.status, 201, JSON.stringify(made.body))
  const { token, agent_id: agentId } = made.body
  const url = `${server.url}/api/rooms/${roomId}/mcp`

  // Ana in the room with a stock y-websocket client, watching presence.
  const { doc, provider } = openProvider(server, roomId, ana)
  defer(() => { provider.destroy(); doc.destroy() })
  await waitSynced(provider)
  const seen = []
  provider.awareness.on('change', () => {
    for (const s of provider.awareness.getStates().values()) if (s.user?.id === agentId) seen.push(s)
  })
  const files = doc.getMap('files')

  // The Python SDK: tools listed, a file written.
  const py = await python(url, token, [['write_file', { path: 'hello.py', content: 'print("hi from the agent")\n' }]])
  for (const name of ['list_files', 'read_file', 'write_file', 'edit_file', 'search', 'exec', 'terminal_send', 'terminal_read', 'allow_host', 'request_preview', 'list_participants', 'read_manifest', 'read_spend', 'export_files']) {
    assert.ok(py.tools.includes(name), `no ${name} in ${py.tools}`)
  }
  assert.deepEqual(py.results.map((r) => r.error), [false], JSON.stringify(py.results))
  await waitFor(() => files.get('hello.py')?.toString() === 'print("hi from the agent")\n', 10_000, 'the edit never reached the room')
  await waitFor(() => seen.length > 0, 10_000, 'the agent never showed in presence')
  assert.equal(seen[0].user.name, 'helper (agent)')
  assert.ok(seen[0].cursor?.anchor, `no cursor in ${JSON.stringify(seen[0])}`)
  const cursorAt = Y.createAbsolutePositionFromRelativePosition(Y.createRelativePositionFromJSON(seen[0].cursor.anchor), doc)
  assert.equal(cursorAt?.type, files.get('hello.py'))

  // The TypeScript SDK: an edit while Ana types at the top of the same file; both stay.
  const client = await tsClient(url, token)
  defer(() => client.close())
  files.get('hello.py').insert(0, '# by ana\n')
  const edited = await client.callTool({ name: 'edit_file', arguments: { path: 'hello.py', old_text: 'hi from the agent', new_text: 'hello, room' } })
  assert.equal(edited.isError, false, text(edited))
  await waitFor(() => files.get('hello.py')?.toString() === '# by ana\nprint("hello, room")\n', 10_000,
    () => `merged: ${JSON.stringify(files.get('hello.py')?.toString())}`)
  const ran = await client.callTool({ name: 'exec', arguments: { argv: ['sh', '-c', 'echo ran-$((6*7))'] } })
  assert.equal(ran.isError, false, text(ran))
  assert.match(text(ran), /ran-42/)
  // Its own spend, as the room counts it.
  const spent = JSON.parse(text(await client.callTool({ name: 'read_spend', arguments: {} })))
  const own = spent.participants.find((p) => p.kind === 'agent' && p.name === 'helper (agent)')
  assert.ok(own.used.execs >= 1 && own.used.tool_calls >= 3, JSON.stringify(spent))
  // The shared terminal: a line typed by the agent, its output answered and readable later.
  const typed = await client.callTool({ name: 'terminal_send', arguments: { text: 'echo from-agent-$((6*7))\n', wait_ms: 5000 } })
  assert.equal(typed.isError, false, text(typed))
  await waitFor(async () => text(await client.callTool({ name: 'terminal_read', arguments: {} })).includes('from-agent-42'),
    20_000, 'the agent\'s line never showed in the terminal')
  assert.doesNotMatch(text(await client.callTool({ name: 'terminal_read', arguments: { max_bytes: 4096 } })), /\x1b/)
  // One driver at a time: while Ana holds the terminal the agent's line is refused, not typed;
  // once she lets go it goes through.
  const anaTerm = await terminal(server, roomId, ana)
  defer(() => anaTerm.close())
  const floorEvents = []
  anaTerm.on('message', (data, binary) => { if (!binary) floorEvents.push(JSON.parse(String(data))) })
  anaTerm.send(JSON.stringify({ type: 'floor', action: 'take' }))
  await waitFor(() => floorEvents.some((e) => e.type === 'floor' && e.holder?.email === 'ana@example.com'), 10_000, 'Ana never held the terminal')
  const blocked = await client.callTool({ name: 'terminal_send', arguments: { text: 'echo blocked-$((2*3))\n', wait_ms: 2000 } })
  assert.equal(blocked.isError, true, text(blocked))
  assert.match(text(blocked), /ana@example\.com has the terminal; .*nothing was typed/)
  anaTerm.send(JSON.stringify({ type: 'floor', action: 'release' }))
  await waitFor(() => floorEvents.some((e) => e.type === 'floor' && e.holder === null), 10_000, 'Ana never let go')
  const after = await client.callTool({ name: 'terminal_send', arguments: { text: 'echo unblocked-$((3*3))\n', wait_ms: 5000 } })
  assert.equal(after.isError, false, text(after))
  await waitFor(async () => text(await client.callTool({ name: 'terminal_read', arguments: {} })).includes('unblocked-9'), 20_000, 'the agent\'s line never ran')
  assert.doesNotMatch(text(await client.callTool({ name: 'terminal_read', arguments: { max_bytes: 65536 } })), /blocked-6/)
  const found = await client.callTool({ name: 'search', arguments: { query: 'hello, room' } })
  assert.match(text(found), /^hello\.py:2: print\("hello, room"\)$/m)
  const resources = await client.listResources()
  assert.ok(resources.resources.some((r) => r.uri === 'room:///hello.py'))
  const read = await client.readResource({ uri: 'room:///hello.py' })
  assert.equal(read.contents[0].text, '# by ana\nprint("hello, room")\n')

  // An observe-only agent reads but cannot write or run: readable errors, audited.
  const watcher = (await api(server, ana, 'POST', `/api/rooms/${roomId}/agents`,
    { name: 'watcher', capabilities: ['observe'], ttl_s: 3600 })).body
  const w = await python(url, watcher.token, [
    ['read_file', { path: 'hello.py' }],
    ['write_file', { path: 'hello.py', content: 'gone' }],
    ['exec', { argv: ['true'] }]
  ])
  assert.deepEqual(w.results.map((r) => r.error), [false, true, true], JSON.stringify(w.results))
  assert.match(w.results[1].text, /refused/)
  assert.equal(files.get('hello.py').toString(), '# by ana\nprint("hello, room")\n')
  // Not another room's, not without a token.
  const other = await createRoom(server, ana)
  const elsewhere = await fetch(`${server.url}/api/rooms/${other}/mcp`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
  })
  assert.equal(elsewhere.status, 403)
  await elsewhere.text()
  const anonymous = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })
  assert.equal(anonymous.status, 401)
  await anonymous.text()

  // The audit: the agent as actor, with its sponsor.
  const me = (await api(server, ana, 'GET', '/api/me')).body
  const chain = (await api(server, ana, 'GET', `/api/rooms/${roomId}/audit`)).body
  const calls = chain.filter((r) => r.action === 'tool_call')
  const write = calls.find((r) => r.actor === agentId && r.details.tool === 'write_file')
  assert.ok(write, JSON.stringify(calls))
  assert.equal(write.details.sponsor, me.id ?? me.user?.id)
  assert.ok(calls.some((r) => r.actor === watcher.agent_id && r.decision === 'deny' && r.details.tool === 'write_file'))
  assert.ok(chain.some((r) => r.actor === agentId && r.action === 'run_command'))
  assert.deepEqual(await server.stop(), { code: 0, signal: null })
})

/** Waits for a pending approval of `action` whose parameters satisfy `match`, as `token` sees
 *  the room's approvals; its id. */
async function pendingApproval (server, token, roomId, action, match = () => true) {
  let id = null
  await waitFor(async () => {
    const list = (await api(server, token, 'GET', `/api/rooms/${roomId}/approvals`)).body
    const items = Array.isArray(list) ? list : list.approvals ?? []
    id = items.find((a) => a.action === action && a.state === 'pending' && match(a.params))?.id ?? null
    return id !== null
  }, 20_000, `no pending ${action}`, 100)
  return id
}

test('an agent\'s commands, hosts and public previews wait for a human\'s decision', { skip, timeout: 180_000 }, async (t) => {
  const previewPort = await freePort()
  const { defer, storage, server, ana, roomId } = await anasRoom(t, {
    extraArgs: ['--preview-url', `http://{id}.preview.localhost:${previewPort}`, '--preview-listen', `127.0.0.1:${previewPort}`]
  })
  const made = await api(server, ana, 'POST', `/api/rooms/${roomId}/agents`,
    { name: 'careful', capabilities: ['observe', 'edit', 'type', 'publish'], ttl_s: 3600, approval_mode: true })
  assert.equal(made.status, 201, JSON.stringify(made.body))
  const agent = made.body
  const client = await tsClient(`${server.url}/api/rooms/${roomId}/mcp`, agent.token)
  defer(() => client.close())
  const decide = (id, approve) => api(server, ana, 'POST', `/api/rooms/${roomId}/approvals/${id}/decision`, { approve })
  const inside = async (script) => (await api(server, ana, 'POST', `/api/rooms/${roomId}/exec`,
    { argv: ['sh', '-c', script], timeout_ms: 30000 })).body.stdout

  // A command waits for the approval of exactly it; approved, the waiting call runs it.
  const approvedCall = client.callTool({ name: 'exec', arguments: { argv: ['sh', '-c', 'echo yes > approved.txt; echo ran'], wait_s: 60 } })
  const first = await pendingApproval(server, ana, roomId, 'run_command', (p) => p.argv?.[2]?.includes('approved.txt'))
  assert.equal(await inside('ls approved.txt 2>&1 || true'), 'ls: cannot access \'approved.txt\': No such file or directory\n')
  // The agent cannot decide its own.
  assert.equal((await api(server, agent.token, 'POST', `/api/rooms/${roomId}/approvals/${first}/decision`, { approve: true })).status, 403)
  assert.equal((await decide(first, true)).status, 200)
  const ran = await approvedCall
  assert.equal(ran.isError, false, text(ran))
  assert.match(text(ran), /ran/)
  assert.equal(await inside('cat approved.txt'), 'yes\n')

  // Denied, it never runs.
  const deniedCall = client.callTool({ name: 'exec', arguments: { argv: ['sh', '-c', 'touch denied.txt'], wait_s: 60 } })
  const second = await pendingApproval(server, ana, roomId, 'run_command', (p) => p.argv?.[2]?.includes('denied.txt'))
  assert.equal((await decide(second, false)).status, 200)
  const denied = await deniedCall
  assert.equal(denied.isError, true)
  assert.match(text(denied), /denied/)
  assert.equal(await inside('ls denied.txt 2>/dev/null; echo done'), 'done\n')
  // A line for the terminal waits the same way, for exactly that text.
  const lineCall = client.callTool({ name: 'terminal_send', arguments: { text: 'touch typed-line.txt\n', wait_s: 60 } })
  const line = await pendingApproval(server, ana, roomId, 'run_command', (p) => p.terminal === 'touch typed-line.txt\r')
  assert.equal(await inside('ls typed-line.txt 2>/dev/null; echo none'), 'none\n')
  assert.equal((await decide(line, true)).status, 200)
  const lined = await lineCall
  assert.equal(lined.isError, false, text(lined))
  await waitFor(async () => (await inside('ls typed-line.txt 2>/dev/null; echo none')) === 'typed-line.txt\nnone\n', 20_000, 'the approved line never ran')
  // Over REST the same: 202 and the approval's id, never the output.
  const rest = await api(server, agent.token, 'POST', `/api/rooms/${roomId}/exec`, { argv: ['true'] })
  assert.equal(rest.status, 202)
  assert.equal(rest.body.state, 'pending_approval')

  // A host for the sandbox: asked, approved by a human, then the waiting call adds it.
  const hostCall = client.callTool({ name: 'allow_host', arguments: { rule: 'registry.npmjs.org', wait_s: 60 } })
  const third = await pendingApproval(server, ana, roomId, 'allow_egress')
  assert.equal((await decide(third, true)).status, 200)
  const host = await hostCall
  assert.equal(host.isError, false, text(host))
  assert.ok((await api(server, ana, 'GET', `/api/rooms/${roomId}/egress`)).body.allow.includes('registry.npmjs.org'))

  // A public preview: pending until a human approves; the call then answers it live.
  const previewCall = client.callTool({ name: 'request_preview', arguments: { port: 8000, visibility: 'public', ttl_s: 600, wait_s: 60 } })
  const fourth = await pendingApproval(server, ana, roomId, 'public_preview')
  assert.equal((await api(server, agent.token, 'POST', `/api/rooms/${roomId}/approvals/${fourth}/decision`, { approve: true })).status, 403)
  // Its sponsor's approval is its own (a public preview needs someone else's, whoever asks);
  // another owner's counts.
  const bySponsor = await decide(fourth, true)
  assert.equal(bySponsor.status, 403)
  assert.match(bySponsor.body.error, /needs another person who holds approve/)
  const ben = await joinByInvite(server, storage, roomId, ana, 'ben@example.com', 'owner')
  assert.equal((await api(server, ben.token, 'POST', `/api/rooms/${roomId}/approvals/${fourth}/decision`, { approve: true })).status, 200)
  const preview = await previewCall
  assert.equal(preview.isError, false, text(preview))
  assert.match(text(preview), /is "active"/)
  const listed = (await api(server, ana, 'GET', `/api/rooms/${roomId}/previews`)).body
  assert.equal(listed[0].state, 'active')
  assert.equal(listed[0].created_by, agent.agent_id)
  assert.deepEqual(await server.stop(), { code: 0, signal: null })
})

test('an agent\'s tool calls are bounded per second', { skip, timeout: 120_000 }, async (t) => {
  const { defer, server, ana, roomId } = await anasRoom(t, { extraArgs: ['--agent-tool-calls-per-s', '1'] })
  const agent = (await api(server, ana, 'POST', `/api/rooms/${roomId}/agents`,
    { name: 'busy', capabilities: ['observe'], ttl_s: 3600 })).body
  const client = await tsClient(`${server.url}/api/rooms/${roomId}/mcp`, agent.token)
  defer(() => client.close())
  // One a second, in bursts of five: a dozen at once meet the bound, with when to try again.
  const results = []
  for (let i = 0; i < 12; i++) results.push(await client.callTool({ name: 'read_manifest', arguments: {} }))
  const refused = results.filter((r) => r.isError)
  assert.ok(refused.length >= 4, `only ${refused.length} of 12 refused`)
  assert.match(text(refused[0]), /too many tool calls: try again in \d+ ms/)
  assert.ok(results.slice(0, 5).every((r) => !r.isError), 'the burst was refused')
  // Another caller has its own bound.
  const other = (await api(server, ana, 'POST', `/api/rooms/${roomId}/agents`,
    { name: 'calm', capabilities: ['observe'], ttl_s: 3600 })).body
  const calm = await tsClient(`${server.url}/api/rooms/${roomId}/mcp`, other.token)
  defer(() => calm.close())
  assert.equal((await calm.callTool({ name: 'read_manifest', arguments: {} })).isError, false)
  assert.deepEqual(await server.stop(), { code: 0, signal: null })
})

test('an agent\'s budget stops its calls with an error it can read; a raise needs an approval', { skip, timeout: 120_000 }, async (t) => {
  const { defer, server, ana, roomId } = await anasRoom(t)
  const created = await api(server, ana, 'POST', `/api/rooms/${roomId}/agents`,
    { name: 'frugal', capabilities: ['observe', 'edit', 'type', 'spend'], ttl_s: 3600, budget: { tool_calls: 3, execs: 1 } })
  assert.equal(created.status, 201, JSON.stringify(created.body))
  const agent = created.body
  const client = await tsClient(`${server.url}/api/rooms/${roomId}/mcp`, agent.token)
  defer(() => client.close())
  const ran = await client.callTool({ name: 'exec', arguments: { argv: ['sh', '-c', 'echo once'] } })
  assert.equal(ran.isError, false, text(ran))
  // Its one command is spent: the next is refused, naming the budget (a tool call is spent too).
  const again = await client.callTool({ name: 'exec', arguments: { argv: ['sh', '-c', 'echo twice'] } })
  assert.equal(again.isError, true)
  assert.match(text(again), /refused: this agent's budget of commands is spent \(1 used of 1\)/)
  assert.equal((await client.callTool({ name: 'list_files', arguments: {} })).isError, false)
  // Three tool calls made: the fourth is refused.
  const fourth = await client.callTool({ name: 'list_files', arguments: {} })
  assert.equal(fourth.isError, true)
  assert.match(text(fourth), /refused: this agent's budget of tool calls is spent \(3 used of 3\)/)
  // Raising it needs someone else's approval: Ana alone cannot.
  const raise = await api(server, ana, 'PUT', `/api/rooms/${roomId}/budget`, { agent_id: agent.agent_id, budget: { tool_calls: 10, execs: 1 } })
  assert.equal(raise.status, 202, JSON.stringify(raise.body))
  assert.equal((await api(server, ana, 'POST', `/api/rooms/${roomId}/approvals/${raise.body.approval_id}/decision`, { approve: true })).status, 403)
  const spend = await api(server, ana, 'GET', `/api/rooms/${roomId}/spend`)
  const mine = spend.body.participants.find((p) => p.who === agent.agent_id)
  assert.deepEqual([mine.kind, mine.used.tool_calls, mine.used.execs, mine.budget], ['agent', 3, 1, { tool_calls: 3, execs: 1 }])
  assert.deepEqual(await server.stop(), { code: 0, signal: null })
})

test('in a moderated room an agent types only while someone who can approve is here', { skip, timeout: 120_000 }, async (t) => {
  const { defer, storage, server, ana, roomId } = await anasRoom(t)
  const ben = await mintToken(storage, 'ben@example.com')
  const invite = await api(server, ana, 'POST', `/api/rooms/${roomId}/invites`, { role: 'editor', ttl_s: 3600, max_uses: 1 })
  assert.equal((await api(server, ben, 'POST', `/api/invites/${invite.body.token}/accept`, {})).status, 200)
  // Only someone who holds approve may moderate the room.
  assert.equal((await api(server, ben, 'PUT', `/api/rooms/${roomId}/moderation`, { moderated: true })).status, 403)
  assert.equal((await api(server, ana, 'PUT', `/api/rooms/${roomId}/moderation`, { moderated: true })).status, 200)
  assert.equal((await api(server, ana, 'GET', `/api/rooms/${roomId}`)).body.moderated, true)
  const agent = (await api(server, ana, 'POST', `/api/rooms/${roomId}/agents`,
    { name: 'typist', capabilities: ['observe', 'edit', 'type'], ttl_s: 3600 })).body
  const client = await tsClient(`${server.url}/api/rooms/${roomId}/mcp`, agent.token)
  defer(() => client.close())
  const send = (line) => client.callTool({ name: 'terminal_send', arguments: { text: `${line}\n`, wait_ms: 3000 } })
  // Nobody here: refused, nothing typed.
  const alone = await send('echo alone-$((1+1))')
  assert.equal(alone.isError, true)
  assert.match(text(alone), /moderated: an agent runs code only while someone who can approve is in the room/)
  // Ben (an editor, no approve) is here: still refused.
  const benTerm = await terminal(server, roomId, ben)
  defer(() => benTerm.close())
  assert.equal((await send('echo with-ben-$((2+2))')).isError, true)
  // Ana (owner) is here: it types.
  const anaTerm = await terminal(server, roomId, ana)
  const watched = await send('echo watched-$((3+3))')
  assert.equal(watched.isError, false, text(watched))
  await waitFor(async () => text(await client.callTool({ name: 'terminal_read', arguments: {} })).includes('watched-6'), 20_000, 'the watched line never ran')
  // Ana leaves: refused again.
  anaTerm.close()
  await waitFor(async () => (await send('echo left-$((4+4))')).isError, 10_000, 'the agent still typed after Ana left')
  const out = text(await client.callTool({ name: 'terminal_read', arguments: { max_bytes: 65536 } }))
  assert.doesNotMatch(out, /alone-2|with-ben-4|left-8/)
  assert.deepEqual(await server.stop(), { code: 0, signal: null })
})
