import { describe, expect, it } from 'vitest'
import { GENESIS, recordHash, verifyChain } from './audit'
import type { AuditRecord } from './api'

function chain (n: number): AuditRecord[] {
  const out: AuditRecord[] = []
  let prev = GENESIS
  for (let seq = 1; seq <= n; seq++) {
    const details = { n: seq, who: 'é✓' }
    const r: AuditRecord = {
      seq, at: 1_700_000_000_000 + seq, actor: 'u1', action: 'edit', decision: 'allow', reason: '',
      details, details_json: JSON.stringify(details), prev_hash: prev, hash: '',
    }
    r.hash = recordHash('room1', r, r.details_json!)
    prev = r.hash
    out.push(r)
  }
  return out
}

describe('audit chain', () => {
  it('verifies a sound chain', () => {
    expect(verifyChain('room1', chain(5))).toEqual({ ok: true, count: 5 })
    expect(verifyChain('room1', [])).toEqual({ ok: true, count: 0 })
  })
  it('matches the server\'s sealing of a known record', () => {
    // Sealed by authz::audit::seal("room1", None, Fields { at: 1, actor: "a", action: "b",
    // decision: "allow", reason: "", details: "{}" }).
    const r: AuditRecord = { seq: 1, at: 1, actor: 'a', action: 'b', decision: 'allow', reason: '', details: {}, details_json: '{}', prev_hash: GENESIS, hash: '' }
    expect(recordHash('room1', r, '{}')).toBe(KNOWN)
  })
  it('names the first bad record', () => {
    const c = chain(4)
    c[2].reason = 'edited'
    expect(verifyChain('room1', c)).toMatchObject({ ok: false, seq: 3, problem: 'content does not match its hash' })
    const d = chain(4)
    d.splice(1, 1)
    expect(verifyChain('room1', d)).toMatchObject({ ok: false, seq: 3 })
    const e = chain(3)
    expect(verifyChain('other-room', e)).toMatchObject({ ok: false, seq: 1 })
  })
})

const KNOWN = 'de65f5210251ebb472cd405ec87de4956fecdd64e5f40b2acf84af573199be85'
