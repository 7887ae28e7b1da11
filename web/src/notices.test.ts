import { describe, expect, it } from 'vitest'
import { approvalWords, askedNotice, decisionNotice, rightsNotice, roleLine, roleOf, whoIs } from './notices'
import { ROLES } from './caps'
import type { Capability } from './api'

const editor = ROLES.editor
const viewer = ROLES.viewer
const owner = ROLES.owner

describe('rights notices', () => {
  it('names the role and who made the change', () => {
    expect(rightsNotice(editor, viewer, 'ana@example.com'))
      .toBe('ana@example.com made you a viewer: you can watch, but not edit or type.')
    expect(rightsNotice(viewer, editor, 'ana@example.com'))
      .toBe('ana@example.com made you an editor: you can edit files and run commands.')
    expect(rightsNotice(editor, owner, null)).toMatch(/^You are now an owner: you can do everything/)
  })

  it('says what matters when the rights are not a preset', () => {
    const noType: Capability[] = ['observe', 'edit']
    expect(rightsNotice(editor, noType, 'ana@example.com')).toBe('You can no longer type in the terminal (ana@example.com).')
    expect(rightsNotice(noType, editor, 'ana@example.com')).toBe('You can type again (ana@example.com).')
    expect(rightsNotice([...editor, 'invite'], editor)).toBe('You are now an editor: you can edit files and run commands.')
    expect(rightsNotice([...noType, 'invite'], [...editor, 'invite'])).toBe('You can type again.')
    expect(rightsNotice([...editor, 'invite'], [...editor, 'invite', 'approve'])).toBe('Your rights changed: you can now approve requests.')
  })

  it('says nothing for no change, the first rights, or a lost room', () => {
    expect(rightsNotice(editor, [...editor].reverse())).toBeNull()
    expect(rightsNotice([], editor)).toBeNull()
    expect(rightsNotice(editor, [])).toBeNull()
  })

  it('knows the presets', () => {
    expect(roleOf(viewer)).toBe('viewer')
    expect(roleOf(['observe', 'edit'])).toBeNull()
  })
})

describe('role lines', () => {
  it('give the role\'s meaning, and what differs from it', () => {
    expect(roleLine('editor', editor)).toBe('Can edit files and run commands.')
    expect(roleLine('editor', [...editor, 'approve'])).toBe('Can edit files and run commands. Also can approve requests.')
    expect(roleLine('editor', ['observe', 'edit'])).toBe('Can edit files and run commands. Cannot type in the terminal.')
    expect(roleLine('custom', ['observe'])).toBe('Custom rights. Also can watch the room.')
  })
})

describe('decisions told to whoever asked', () => {
  it('name the decider and the request', () => {
    expect(decisionNotice('export', 'approved', 'ben@example.com')).toBe('ben@example.com approved your request to export files.')
    expect(decisionNotice('public_preview', 'denied', 'ben@example.com')).toBe('ben@example.com refused your request to publish a public preview.')
    expect(decisionNotice('add_secret', 'expired', null)).toBe('Nobody decided your request to add a secret in time; it expired.')
    expect(decisionNotice('export', 'used', 'ben@example.com')).toBe('ben@example.com approved your request to export files.')
    expect(decisionNotice('export', 'pending', null)).toBeNull()
  })
})

describe('approvals in words', () => {
  const people = [{ user_id: 'u1', email: 'ana@example.com' }]
  const agents = [{ agent_id: 'a1', name: 'helper-bot', sponsor_email: 'ana@example.com' }]
  it('names people and agents', () => {
    expect(whoIs('u1', people, agents)).toBe('ana@example.com')
    expect(whoIs('a1', people, agents)).toBe('helper-bot (an agent brought in by ana@example.com)')
    expect(whoIs('zz', people, agents)).toBe('Someone no longer in the room')
  })
  it('says what is asked', () => {
    expect(approvalWords('run_command', { argv: ['/bin/bash', '-l', '-c', 'pytest -q'], cwd: '' })).toBe('run `pytest -q`')
    expect(approvalWords('run_command', { argv: ['ls', 'a b'], cwd: 'src' })).toBe("run `ls 'a b'` in src")
    expect(approvalWords('run_command', { terminal: 'rm -rf build\r' })).toBe('type `rm -rf build` into a terminal')
    expect(approvalWords('run_command', { argv: ['python3'], cwd: '', stdin: true })).toMatch(/^run `python3` with input/)
    expect(approvalWords('public_preview', { port: 8000, visibility: 'public', ttl_s: 3600 })).toBe('make port 8000 public to anyone with the link for 1 hour')
    expect(approvalWords('export', { files: ['a.py', 'b.py'] })).toBe('export 2 files: a.py, b.py')
    expect(approvalWords('allow_egress', { rule: 'pypi.org' })).toBe('open the network to pypi.org')
    expect(approvalWords('fork', { checkpoint: 'c1' })).toBe('fork the room')
    expect(askedNotice('ana@example.com', 'allow_egress', { rule: 'x.org' })).toBe('ana@example.com asks to open the network to x.org. Decide in the Approvals panel.')
  })
})
