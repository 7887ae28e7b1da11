// Typing kept through a file's departure: what the editor showed when its file left the
// document (`base`), what the file it became holds now, and what was typed in the editor
// since, brought together.

import { ChangeSet } from '@codemirror/state'

/** The changes that make `from` read `to`: one replacement between their common start and end
 *  (what a rename's copy gains meanwhile is typing carried there, at one place or few). */
export function diffChanges (from: string, to: string): ChangeSet {
  let start = 0
  const max = Math.min(from.length, to.length)
  while (start < max && from.charCodeAt(start) === to.charCodeAt(start)) start++
  let end = 0
  while (end < max - start && from.charCodeAt(from.length - 1 - end) === to.charCodeAt(to.length - 1 - end)) end++
  if (start === from.length && start === to.length) return ChangeSet.empty(from.length)
  return ChangeSet.of([{ from: start, to: from.length - end, insert: to.slice(start, to.length - end) }], from.length)
}

/** `local` (typed on `base`) and what the file gained since (`base` to `now`), each rebased
 *  over the other: `toText` makes `now` hold the typing too, `toView` makes the editor (`base`
 *  with `local`) show what the file gained. Both end at the same text. */
export function rebase (base: string, now: string, local: ChangeSet): { toText: ChangeSet, toView: ChangeSet } {
  const theirs = diffChanges(base, now)
  return { toText: local.map(theirs), toView: theirs.map(local, true) }
}
