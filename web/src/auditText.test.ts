import { describe, expect, it } from 'vitest'
import { actorText, auditSentence, foldMetered, jsonLines, meteredSentence } from './auditText'
import type { AuditRecord } from './api'

function rec (action: string, details: unknown, extra: Partial<AuditRecord> = {}): AuditRecord {
  return { seq: 1, at: 0, actor: 'u-ana', action, decision: 'allow', reason: '', details, prev_hash: '', hash: '', ...extra }
}
const names = (id: string): string => ({ 'u-ana': 'ana@example.com', 'u-ben': 'ben@example.com' } as Record<string, string>)[id] ?? id

describe('audit sentences', () => {
  it('name people, a removed one by the email the server gives', () => {
    expect(auditSentence(rec('change_participant', { target: 'u-ben', to: ['observe'] }), names)).toBe('ana@example.com made ben@example.com a viewer.')
    expect(auditSentence(rec('remove_participant', { target: 'u-gone' }, { target_email: 'cy@example.com' }), names)).toBe('ana@example.com removed cy@example.com from the room.')
    expect(auditSentence(rec('remove_participant', { target: 'u-ben' }, { actor: 'u-ben' }), names)).toBe('ben@example.com left the room.')
    expect(auditSentence(rec('create_invite', { role: 'editor' }, { actor: 'u-old', actor_email: 'old@example.com' }), names)).toBe('old@example.com made an invite link for an editor.')
  })

  it('tell file operations, a deletion with where the file waits', () => {
    expect(auditSentence(rec('create_file', { path: 'a.py' }), names)).toBe('ana@example.com created a.py.')
    expect(auditSentence(rec('rename_file', { path: 'a.py', to: 'b.py' }), names)).toBe('ana@example.com renamed a.py to b.py.')
    expect(auditSentence(rec('move_file', { path: 'b.py', to: 'src/b.py' }), names)).toBe('ana@example.com moved b.py to src/b.py.')
    expect(auditSentence(rec('delete_file', { path: 'src/b.py', bytes: 12, trash_id: 't' }), names)).toBe('ana@example.com deleted src/b.py (12 bytes); it waits in the trash.')
    expect(auditSentence(rec('delete_file', { path: 'src/b.py', bytes: 12, came_back: true }), names)).toBe('ana@example.com deleted src/b.py (12 bytes); it came back at once with someone\'s typing in it.')
    expect(auditSentence(rec('delete_file', { path: 'big.log', bytes: 2_000_000, not_kept: true }), names)).toMatch(/^ana@example.com deleted big.log \(.*\); its text was not kept\.$/)
    expect(auditSentence(rec('file_operations_unrecorded', { count: 201 }), names)).toBe('ana@example.com made 201 more file operations at once: counted here, not listed one by one.')
    expect(auditSentence(rec('restore_file', { path: 'b (2).py', deleted_path: 'b.py' }), names)).toBe('ana@example.com restored b (2).py from the trash (deleted as b.py).')
  })

  it('name a person by the name they chose, with the address it belongs to', () => {
    expect(auditSentence(rec('create_room', {}, { actor_email: 'ana@example.com', actor_name: 'Ana Lima' }), names)).toBe('Ana Lima (ana@example.com) created the room.')
  })

  it('say what was refused', () => {
    expect(auditSentence(rec('type', {}, { actor: 'u-ben', decision: 'deny', reason: 'missing capability type' }), names))
      .toBe('ben@example.com tried to type in the terminal: refused (missing capability type).')
  })

  it('name one act by one name, however it came out', () => {
    expect(auditSentence(rec('run_command', { program: 'make' }), names)).toBe('ana@example.com ran make.')
    expect(auditSentence(rec('run_command', { terminal: true, commands: 2 }), names)).toBe('ana@example.com ran 2 command(s) in the terminal.')
    expect(auditSentence(rec('run_command', { program: 'make' }, { decision: 'needs_approval' }), names)).toBe('ana@example.com asked to run make.')
    expect(auditSentence(rec('run_command', {}, { decision: 'deny', reason: 'missing capability type' }), names))
      .toBe('ana@example.com tried to run a command: refused (missing capability type).')
    expect(auditSentence(rec('public_preview', {}, { decision: 'needs_approval' }), names)).toBe('ana@example.com asked for a public preview.')
  })

  it('tell the sandbox\'s life', () => {
    expect(auditSentence(rec('sandbox_start', { reason: 'a viewer joined', resumed_from_kept: 'memory' }, { actor: 'system' }), names))
      .toBe('The sandbox started from its kept memory (a viewer joined).')
    expect(auditSentence(rec('sandbox_stop', { reason: 'idle' }, { actor: 'system' }), names)).toBe('The sandbox stopped (idle).')
    const ana = 'a'.repeat(32)
    expect(auditSentence(rec('sandbox_stop', { reason: `stop requested by ${ana}` }, { actor: ana, actor_email: 'ana@example.com' }), names))
      .toBe('ana@example.com stopped the sandbox (stop requested by ana@example.com).')
    expect(auditSentence(rec('something_new', {}), names)).toBe('ana@example.com: something new.')
  })

  it('tell an export of files from a download of the workspace', () => {
    expect(auditSentence(rec('export', { params: { files: ['a.py'] } }), names)).toBe('ana@example.com exported files.')
    expect(auditSentence(rec('export', { params: { workspace: true }, bytes: 3 * 1048576 }), names))
      .toBe('ana@example.com downloaded the workspace (3 MiB).')
  })
})

describe('the audit log as a team reads it', () => {
  const agent = (id: string): string | null => id === 'u-bot' ? 'helper-bot (an agent brought in by ana@example.com)' : null
  it('names agents by name and sponsor, never by their made-up address', () => {
    const r = rec('run_command', { program: 'pytest' }, { actor: 'u-bot', actor_email: 'agent-1f2e@agents.invalid' })
    expect(auditSentence(r, names, agent)).toBe('helper-bot (an agent brought in by ana@example.com) ran pytest.')
    const named = rec('run_command', { program: 'pytest' }, { actor: 'u-x', actor_email: 'agent-1@agents.invalid', actor_agent: { name: 'old-bot', sponsor_email: 'ben@example.com' } })
    expect(auditSentence(named, names)).toBe('old-bot (an agent brought in by ben@example.com) ran pytest.')
    const gone = rec('run_command', { program: 'pytest' }, { actor: 'u-old', actor_email: 'agent-99@agents.invalid' })
    expect(actorText(gone, names, agent)).toBe('An agent no longer in the room')
  })
  it('folds runs of metered records into one line', () => {
    const m = (seq: number): AuditRecord => rec('metered', {}, { seq, at: seq * 1000, actor: 'system' })
    const lines = foldMetered([m(1), m(2), rec('create_room', {}, { seq: 3 }), m(4)])
    expect(lines.map((l) => l.kind === 'metered' ? l.records.length : l.record.action)).toEqual([2, 'create_room', 1])
    expect(meteredSentence([m(1), m(2)], (t) => `t${t}`)).toBe("The server wrote down the room's metered use 2 times, t1000 to t2000.")
  })
  it('exports JSON Lines, one record a line', () => {
    const out = jsonLines([rec('a', {}), rec('b', {})])
    expect(out.trimEnd().split('\n').map((l) => JSON.parse(l).action)).toEqual(['a', 'b'])
  })
})
