// Verifies a room's audit chain in the browser, the way the server seals it
// (authz/src/audit.rs): SHA-256 over length-prefixed fields, each record naming the previous
// record's hash. The server's word is not taken for it.

import { sha256 } from '@noble/hashes/sha2.js'
import type { AuditRecord } from './api'

export const GENESIS = '0'.repeat(64)

const enc = new TextEncoder()

function u64 (n: number): Uint8Array {
  const b = new Uint8Array(8)
  new DataView(b.buffer).setBigUint64(0, BigInt(n))
  return b
}

function i64 (n: number): Uint8Array {
  const b = new Uint8Array(8)
  new DataView(b.buffer).setBigInt64(0, BigInt(n))
  return b
}

function hex (b: Uint8Array): string {
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('')
}

export function recordHash (chain: string, r: AuditRecord, details: string): string {
  const parts: Uint8Array[] = []
  const field = (bytes: Uint8Array): void => { parts.push(u64(bytes.length), bytes) }
  field(enc.encode('coderoom-audit-v1'))
  field(enc.encode(chain))
  field(i64(r.seq))
  field(i64(r.at))
  field(enc.encode(r.actor))
  field(enc.encode(r.action))
  field(enc.encode(r.decision))
  field(enc.encode(r.reason))
  field(enc.encode(details))
  field(enc.encode(r.prev_hash))
  const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0))
  let at = 0
  for (const p of parts) { all.set(p, at); at += p.length }
  return hex(sha256(all))
}

export type Verdict =
  | { ok: true, count: number }
  | { ok: false, seq: number, problem: string }

export function verifyChain (chain: string, records: AuditRecord[]): Verdict {
  let prev = GENESIS
  let expected = 1
  for (const r of records) {
    if (r.seq !== expected) return { ok: false, seq: r.seq, problem: `expected record ${expected}: a record is missing or out of order` }
    if (r.prev_hash !== prev) return { ok: false, seq: r.seq, problem: 'does not follow the previous record' }
    const details = r.details_json ?? JSON.stringify(r.details)
    if (recordHash(chain, r, details) !== r.hash) return { ok: false, seq: r.seq, problem: 'content does not match its hash' }
    prev = r.hash
    expected++
  }
  return { ok: true, count: records.length }
}
