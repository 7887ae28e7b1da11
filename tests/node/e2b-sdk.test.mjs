// The E2B-compatible door with the stock npm SDK (`e2b`, pinned in package.json), as a
// harness written for E2B would use it: only E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL are
// set. It creates the room's sandbox, runs commands with their output streamed as printed,
// sees exit codes, writes, reads and lists files in the room's workspace (the file it wrote is
// in the room's document, as people see it), runs a background command and kills it, and
// kill() ends its session while the room goes on. The Python SDK's twin is server/tests/e2b.rs.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from 'e2b'
import { cleanups, createStorage, startServer, mintToken, api, createRoom, openProvider, waitSynced, waitFor } from './lib/server.mjs'

test('the stock npm e2b SDK drives a room under its agent\'s rights', { timeout: 180_000 }, async (t) => {
  const defer = cleanups(t)
  const storage = await createStorage('sqlite')
  defer(() => storage.cleanup())
  const server = await startServer(storage)
  defer(() => server.kill())
  const ana = await mintToken(storage, 'ana@example.com')
  const roomId = await createRoom(server, ana)
  const made = await api(server, ana, 'POST', `/api/rooms/${roomId}/agents`,
    { name: 'harness', capabilities: ['observe', 'edit', 'type'], ttl_s: 3600 })
  assert.equal(made.status, 201, JSON.stringify(made.body))
  const saved = { ...process.env }
  defer(() => { for (const k of ['E2B_API_KEY', 'E2B_API_URL', 'E2B_SANDBOX_URL']) { if (saved[k] === undefined) delete process.env[k]; else process.env[k] = saved[k] } })
  process.env.E2B_API_KEY = made.body.token
  process.env.E2B_API_URL = `${server.url}/api/e2b`
  process.env.E2B_SANDBOX_URL = `${server.url}/api/e2b/envd`

  const sbx = await Sandbox.create()
  assert.equal(sbx.sandboxId, roomId)

  // Output as it is printed: the first line arrives well before the second.
  const seen = []
  const start = Date.now()
  const r = await sbx.commands.run('echo one; sleep 1.5; echo two', { onStdout: (d) => seen.push([Date.now() - start, d]) })
  assert.equal(r.stdout, 'one\ntwo\n')
  assert.equal(r.exitCode, 0)
  assert.equal(seen.length, 2, JSON.stringify(seen))
  assert.ok(seen[1][0] - seen[0][0] > 1000, `output came at the end: ${JSON.stringify(seen)}`)
  await assert.rejects(sbx.commands.run('echo bad >&2; exit 3'),
    (e) => e instanceof CommandExitError && e.exitCode === 3 && e.stderr === 'bad\n')

  // Files: in the room's workspace, and in its document.
  await sbx.files.write('/home/user/hello.js', 'console.log(6 * 7)\n')
  assert.equal(await sbx.files.read('/home/user/hello.js'), 'console.log(6 * 7)\n')
  assert.equal((await sbx.commands.run('node hello.js || python3 -c "print(42)"')).stdout, '42\n')
  const names = (await sbx.files.list('/home/user')).map((e) => e.name)
  assert.ok(names.includes('hello.js'), JSON.stringify(names))
  assert.equal(await sbx.files.exists('/home/user/nope'), false)
  const { doc, provider } = openProvider(server, roomId, ana)
  defer(() => { provider.destroy(); doc.destroy() })
  await waitSynced(provider)
  await waitFor(() => doc.getMap('files').get('hello.js')?.toString() === 'console.log(6 * 7)\n', 10_000,
    'the file the SDK wrote never reached the room\'s document')

  // A background command, listed and killed: its wait fails with exit code -1.
  const h = await sbx.commands.run('sleep 60', { background: true })
  assert.deepEqual((await sbx.commands.list()).map((p) => p.pid), [h.pid])
  assert.equal(await sbx.commands.kill(h.pid), true)
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode === -1)
  assert.equal(await sbx.commands.kill(h.pid), false)

  // Its session ends; the room and its sandbox go on for the people in it.
  assert.equal(await sbx.kill(), true)
  const status = await api(server, ana, 'GET', `/api/rooms/${roomId}/sandbox`)
  assert.equal(status.body.state, 'running', JSON.stringify(status.body))
})
