// Random editing workload for convergence tests.

import * as Y from 'yjs'
import { setTimeout as sleep } from 'node:timers/promises'

/** Deterministic PRNG (mulberry32), so a failing run can be replayed from its printed seed. */
export function rng (seed) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

const ALPHABET = 'abcdefghijklmnopqrstuvwxyz     \n{}();=+-*/é✓🙂'

function randomString (rand, maxLen) {
  const chars = [...ALPHABET]
  let s = ''
  const n = 1 + Math.floor(rand() * maxLen)
  for (let i = 0; i < n; i++) s += chars[Math.floor(rand() * chars.length)]
  return s
}

/** One random insert or delete at a random position of `text` (inside the caller's transaction). */
export function randomOp (rand, text, tag) {
  const len = text.length
  if (len > 0 && rand() < 0.35) {
    const pos = Math.floor(rand() * len)
    const n = Math.min(len - pos, 1 + Math.floor(rand() * 4))
    text.delete(pos, n)
  } else {
    const pos = Math.floor(rand() * (len + 1))
    text.insert(pos, (rand() < 0.2 ? tag : '') + randomString(rand, 6))
  }
}

/**
 * Runs `ops` random edits on `doc`, spread over time (a few ms apart, sometimes several in one
 * transaction). Mostly on `main`, a share on `other` once some client has created it. `onStep`
 * is called with the op index before each step, for workload-specific extras.
 */
export async function editLoop (doc, { seed, ops, main = 'main.txt', other = 'src/other.txt', tag = '', maxGapMs = 12, onStep }) {
  const rand = rng(seed)
  const files = doc.getMap('files')
  for (let i = 0; i < ops;) {
    if (onStep) onStep(i, rand)
    const batch = rand() < 0.15 ? 2 + Math.floor(rand() * 3) : 1
    doc.transact(() => {
      for (let k = 0; k < batch && i < ops; k++, i++) {
        const name = files.has(other) && rand() < 0.25 ? other : main
        const text = files.get(name)
        if (text instanceof Y.Text) randomOp(rand, text, tag)
      }
    })
    const gap = Math.floor(rand() * (maxGapMs + 1))
    await (gap === 0 ? new Promise((resolve) => setImmediate(resolve)) : sleep(gap))
  }
}
