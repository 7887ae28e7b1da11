// Agents in a real browser: the owner adds an agent from the People panel (its token shown once),
// an MCP client (the official TypeScript SDK) writes a file with that token, the owner's page
// shows the file arrive and the agent at work in the People panel, marked as an agent with its
// sponsor; ending it there stops its token.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { api, skipUnless, waitFor } from './lib/server.mjs'
import { HAVE_CHROMIUM, CHROMIUM, scene, createRoomFromPage, login, shot } from './lib/browser.mjs'

const skip = skipUnless(HAVE_CHROMIUM, 'CHROMIUM', `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CODEROOM_CHROMIUM)`)

test('an agent added from the People panel works in the room and ends from there', { skip, timeout: 180_000 }, async (t) => {
  const { storage, server, people: [ana] } = await scene(t, ['ana@example.com'])
  await login(ana, storage.dataDir)
  const roomId = await createRoomFromPage(ana, 'with an agent')
  const page = ana.page
  await page.keyboard.press('Alt+1')
  await page.getByTestId('agent-open').click()
  await page.getByTestId('agent-name').fill('helper')
  await page.getByTestId('agent-cap-type').check()
  await page.getByTestId('agent-create').click()
  const tokenBox = page.getByTestId('agent-token')
  await tokenBox.waitFor()
  const token = await tokenBox.inputValue()
  assert.match(token, /^crt_[0-9a-f]{64}$/)
  const endpoint = await page.getByTestId('agent-endpoint').innerText()
  assert.equal(endpoint, `${server.url}/api/rooms/${roomId}/mcp`)
  const row = page.getByTestId('agent-helper')
  await row.filter({ hasText: 'brought in by ana@example.com' }).waitFor()
  assert.match(await row.innerText(), /observe[\s\S]*edit[\s\S]*type/)

  // The agent writes through MCP; the page shows the file and the agent at work.
  const client = new Client({ name: 'coderoom-browser-test', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(endpoint), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } }
  }))
  t.after(() => client.close())
  const wrote = await client.callTool({ name: 'write_file', arguments: { path: 'from-agent.txt', content: 'written by the agent\n' } })
  assert.equal(wrote.isError, false)
  await page.locator('[data-path="from-agent.txt"]').waitFor()
  await row.locator('.dot.on').waitFor({ timeout: 5000 })
  await shot(page, '23-agent-at-work')

  // Ended from the panel: gone from it, its token refused.
  // Ending an agent asks once, in words.
  await row.getByTestId('agent-end-helper').click()
  await row.getByTestId('agent-end-helper').filter({ hasText: 'End helper: click again' }).click()
  await row.waitFor({ state: 'detached' })
  await waitFor(async () => (await api(server, token, 'GET', `/api/rooms/${roomId}`)).status === 401, 5000, 'the token still works')
  assert.deepEqual(ana.errors, [])
  assert.deepEqual(await server.stop(), { code: 0, signal: null })
})
