import { describe, expect, it } from 'vitest'
import { parse, safeNext, loginUrl } from './router'
import { abilities, settableRoles, canRemove } from './caps'
import { buildTree, checkPath, languageOf, folderMoves, movedTo } from './files'
import { DocConnection, closeMeaning } from './conn'
import { FlowGate, Backoff, parseEvent } from './flow'
import type { Participant } from './api'
import { vmSentence } from './sandbox'

describe('routes', () => {
  it('maps paths to pages', () => {
    expect(parse('/')).toEqual({ page: 'rooms' })
    expect(parse('/rooms/abc123')).toEqual({ page: 'room', id: 'abc123' })
    expect(parse('/invite/tok_EN-1')).toEqual({ page: 'invite', token: 'tok_EN-1' })
    expect(parse('/admin')).toEqual({ page: 'admin' })
    expect(parse('/deletions/d1')).toEqual({ page: 'deletion', id: 'd1' })
    expect(parse('/login', '?next=%2Frooms%2Fx')).toEqual({ page: 'login', next: '/rooms/x' })
    expect(parse('/rooms/a/b').page).toBe('not_found')
    expect(parse('/rooms/..%2Fetc').page).toBe('not_found')
    expect(parse('/rooms/%E0').page).toBe('not_found')
  })
  it('never redirects off this origin after login', () => {
    expect(safeNext('//evil.example')).toBe('/')
    expect(safeNext('https://evil.example')).toBe('/')
    expect(safeNext('/\\evil.example')).toBe('/')
    expect(safeNext('/\t/evil.example')).toBe('/')
    expect(safeNext('/\n/evil.example')).toBe('/')
    expect(safeNext('/rooms/x?a=1#b')).toBe('/rooms/x?a=1#b')
    expect(safeNext('/.//evil.example')).toBe('/')
    expect(safeNext('/..//evil.example')).toBe('/')
    expect(safeNext(null)).toBe('/')
    expect(safeNext('/invite/t')).toBe('/invite/t')
    expect(loginUrl('/invite/t')).toBe('/login?next=%2Finvite%2Ft')
  })
})

describe('abilities', () => {
  it('type is effective only with edit', () => {
    expect(abilities(['observe', 'type']).type).toBe(false)
    expect(abilities(['observe', 'edit', 'type']).type).toBe(true)
  })
  it('invites never offer more than the inviter holds', () => {
    expect(abilities(['observe', 'edit', 'type', 'invite']).inviteRoles).toEqual(['editor', 'viewer'])
    expect(abilities(['observe', 'edit', 'type']).inviteRoles).toEqual([])
  })
  it('role changes: lowering needs revoke, raising needs the new role\'s capabilities', () => {
    const editor: Participant = { user_id: 'b', email: 'b@x', role: 'editor', capabilities: ['observe', 'edit', 'type'] }
    const owner = abilities(['observe', 'edit', 'type', 'revoke', 'invite']).grantable
    expect(settableRoles(['observe', 'edit', 'type', 'revoke'], editor, 'a', 'b')).toEqual(['viewer'])
    expect(settableRoles(['observe', 'edit', 'type'], editor, 'a', 'b')).toEqual([])
    expect(settableRoles(['observe', 'edit', 'type', 'revoke'], editor, 'b', 'b')).toEqual([])
    const viewer: Participant = { ...editor, role: 'viewer', capabilities: ['observe'] }
    expect(settableRoles(['observe', 'edit', 'type'], viewer, 'a', 'b')).toEqual(['editor'])
    expect(owner).not.toContain('observe')
    expect(canRemove(['revoke'], 'a', 'b')).toBe(true)
    expect(canRemove(['revoke'], 'a', 'a')).toBe(false)
    expect(canRemove(['edit'], 'a', 'b')).toBe(false)
  })
})

describe('files', () => {
  it('builds a sorted tree, directories first', () => {
    const t = buildTree(['src/main.rs', 'README.md', 'src/lib/a.rs', 'Cargo.toml'])
    expect(t.map((n) => n.name)).toEqual(['src', 'Cargo.toml', 'README.md'])
    expect(t[0].children.map((n) => n.path)).toEqual(['src/lib/', 'src/main.rs'])
    expect(t[0].children[0].children[0]).toMatchObject({ name: 'a.rs', path: 'src/lib/a.rs', dir: false })
  })
  it('refuses paths the server would refuse, with a reason', () => {
    expect(checkPath(' src/x.rs ')).toEqual({ ok: true, path: 'src/x.rs' })
    expect(checkPath('./a')).toEqual({ ok: true, path: 'a' })
    for (const bad of ['', '/etc/passwd', 'a/../b', 'a//b', 'dir/', 'a\u0000b', 'a\\b', 'x'.repeat(5000)]) {
      const r = checkPath(bad)
      expect(r.ok, bad).toBe(false)
      if (!r.ok) expect(r.reason.length).toBeGreaterThan(5)
    }
  })
  it('picks a language by extension', () => {
    expect(languageOf('src/main.rs')).toBe('rust')
    expect(languageOf('a.TS')).toBe('typescript')
    expect(['notes/a.md', 'x.json', 'i.html', 's.css', 'm.c', 'm.hpp', 'A.java', 'main.go', 'c.yml', 'run.sh', 'coderoom.toml', 'LICENSE']
      .map(languageOf)).toEqual(['markdown', 'json', 'html', 'css', 'cpp', 'cpp', 'java', 'go', 'yaml', 'shell', 'toml', 'plain'])
    expect(languageOf('Makefile')).toBe('plain')
  })
})

describe('connection state', () => {
  it('says offline with local edits pending until a resync', () => {
    const c = new DocConnection()
    expect(c.view().kind).toBe('busy')
    c.status('connected'); c.sync(true)
    expect(c.view()).toEqual({ label: 'Synced', kind: 'ok' })
    c.localEdit()
    expect(c.pending).toBe(0)
    c.status('disconnected')
    c.localEdit(); c.localEdit()
    expect(c.view()).toEqual({ label: 'Offline — 2 local edits not yet sent', kind: 'offline' })
    c.status('connecting')
    // A retry that has not connected yet: still offline.
    expect(c.view()).toEqual({ label: 'Offline — 2 local edits not yet sent', kind: 'offline' })
    c.sync(true) // not connected yet: still pending
    expect(c.pending).toBe(2)
    c.status('connected'); c.sync(true)
    expect(c.view().kind).toBe('ok')
    c.status('disconnected')
    c.refused('document size limit reached')
    expect(c.view().label).toBe('Offline (the server said: document size limit reached)')
    c.status('connected'); c.sync(true)
    expect(c.view().label).toBe('Synced')
    c.end('You were removed from this room.')
    expect(c.view()).toEqual({ label: 'You were removed from this room.', kind: 'ended' })
  })
  it('ends on removal, deletion and logout; reconnects otherwise', () => {
    expect(closeMeaning(4003)).toEqual({ end: true, message: 'You were removed from this room.' })
    expect(closeMeaning(4004).end).toBe(true)
    expect(closeMeaning(4001).end).toBe(true)
    expect(closeMeaning(1006).end).toBe(false)
    expect(closeMeaning(4008).end).toBe(false)
  })
})

describe('terminal flow control', () => {
  it('asks to drop the connection past the high mark and resumes below the low mark', () => {
    const g = new FlowGate(1000, 100)
    expect(g.written(600)).toBe(true)
    expect(g.written(600)).toBe(false)
    expect(g.drawn(600)).toBe(false)
    expect(g.drawn(550)).toBe(true)
    expect(g.backlog).toBe(50)
    g.drawn(10_000)
    expect(g.backlog).toBe(0)
    expect(g.written(1000)).toBe(true)
  })
  it('backs off exponentially up to a ceiling, and starts over after a success', () => {
    const b = new Backoff(100, 1000)
    expect([b.next(), b.next(), b.next(), b.next(), b.next()]).toEqual([100, 200, 400, 800, 1000])
    b.reset()
    expect(b.next()).toBe(100)
  })
  it('parses server events and ignores garbage', () => {
    expect(parseEvent('{"type":"denied","reason":"no"}')).toEqual({ type: 'denied', reason: 'no' })
    expect(parseEvent('nope')).toBeNull()
    expect(parseEvent('{"x":1}')).toBeNull()
    expect(parseEvent('null')).toBeNull()
  })
})

describe('folder renames', () => {
  const paths = ['src/a.ts', 'src/lib/b.ts', 'srcs/c.ts', 'README.md']
  it('moves every file under the folder, and nothing else', () => {
    expect(folderMoves(paths, 'src/', 'app')).toEqual({ ok: true, moves: [['src/a.ts', 'app/a.ts'], ['src/lib/b.ts', 'app/lib/b.ts']] })
    expect(folderMoves(paths, 'src/lib/', 'src/util/')).toEqual({ ok: true, moves: [['src/lib/b.ts', 'src/util/b.ts']] })
  })
  it('refuses a move onto files in use, into itself, or onto a file', () => {
    expect(folderMoves([...paths, 'app/a.ts'], 'src/', 'app')).toEqual({ ok: false, reason: 'app/a.ts already exists' })
    expect(folderMoves(paths, 'src/', 'src/inner')).toMatchObject({ ok: false })
    expect(folderMoves(paths, 'src/', 'src')).toMatchObject({ ok: false })
    expect(folderMoves(paths, 'src/', 'README.md')).toEqual({ ok: false, reason: 'README.md is a file' })
  })
  it('finds where a file went', () => {
    expect(movedTo('a.txt', ['b.txt'])).toBe('b.txt')
    expect(movedTo('src/x.rs', ['lib/y.rs', 'lib/x.rs'])).toBe('lib/x.rs')
    expect(movedTo('a.txt', ['b.txt', 'c.txt'])).toBeNull()
    expect(movedTo('a.txt', [])).toBeNull()
  })
})

describe('the sandbox panel', () => {
  it('says a microVM receipt in plain words', () => {
    expect(vmSentence({ tier: 'namespace' })).toBeNull()
    expect(vmSentence(null)).toBeNull()
    const s = vmSentence({
      tier: 'microvm',
      vm: { vmm: 'qemu', vmm_version: '7.2.22', accel: 'tcg', guest_kernel: '6.1.0-57-cloud-amd64', image: '1b64cd1fc1fe999c298a', disk_bytes: 134217728 }
    })
    expect(s).toContain('QEMU 7.2.22 with software emulation')
    expect(s).toContain('guest kernel 6.1.0-57-cloud-amd64')
    expect(s).toContain('guest image 1b64cd1fc1fe,')
    expect(s).toContain('a 128 MiB workspace disk')
    expect(vmSentence({ vm: { vmm: 'cloud-hypervisor', accel: 'kvm' } })).toContain('cloud-hypervisor  with hardware virtualisation (KVM)')
  })
})

describe('quick open', () => {
  it('ranks a match in the name above one across folders, tight and early first', async () => {
    const { quickMatches } = await import('./files')
    const paths = ['src/main.rs', 'docs/readme.md', 'b.md', 'notes/big-meeting.md', 'Cargo.toml']
    expect(quickMatches(paths, 'bmd')).toEqual(['b.md', 'notes/big-meeting.md'])
    expect(quickMatches(paths, 'MAIN')).toEqual(['src/main.rs'])
    expect(quickMatches(paths, 'srcmain')).toEqual(['src/main.rs'])
    expect(quickMatches(paths, 'zzz')).toEqual([])
    expect(quickMatches(paths, '', 2)).toEqual(['b.md', 'Cargo.toml'])
  })
})

describe('search across files', () => {
  it('finds every line with the text, any case, with where it is', async () => {
    const { searchFiles } = await import('./files')
    const texts: [string, string][] = [['b.py', 'x = 1\nprint(X)\n'], ['a.md', '# Title\nno\n']]
    expect(searchFiles(texts, 'x')).toEqual([
      { path: 'b.py', line: 1, offset: 0, text: 'x = 1' },
      { path: 'b.py', line: 2, offset: 12, text: 'print(X)' },
    ])
    expect(searchFiles(texts, 'TITLE')).toEqual([{ path: 'a.md', line: 1, offset: 2, text: '# Title' }])
    expect(searchFiles(texts, '')).toEqual([])
    expect(searchFiles(texts, 'x', 1)).toHaveLength(1)
  })
})

describe('uploads', () => {
  it('take UTF-8 text up to 1 MiB and nothing else', async () => {
    const { asText, MAX_TEXT_BYTES } = await import('./files')
    expect(asText(new TextEncoder().encode('héllo\n'))).toEqual({ ok: true, text: 'héllo\n' })
    expect(asText(new Uint8Array([0xff, 0xfe]))).toEqual({ ok: false, reason: 'is not UTF-8 text' })
    expect(asText(new Uint8Array([65, 0, 66]))).toEqual({ ok: false, reason: 'is not text (it holds NUL bytes)' })
    expect(asText(new Uint8Array(MAX_TEXT_BYTES + 1))).toEqual({ ok: false, reason: 'is larger than 1 MiB' })
  })
})
