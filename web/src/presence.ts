// Who else is in the room, from the document's awareness states (stamped by the server with
// each connection's user: id, email as name, colour), and where they are: the file they have
// open and their cursor in it.

export interface Peer {
  id: string
  name: string
  color: string
  /** The file they have open, if any. */
  file: string | null
  /** Their cursor's head (a Yjs relative position as JSON), if any. */
  head: unknown
}

interface State {
  user?: { id?: unknown, name?: unknown, color?: unknown }
  file?: unknown
  cursor?: { head?: unknown } | null
}

/** Everyone but `selfId`, one entry per person (their latest connection), by name. */
export function peers (states: Map<number, unknown>, selfId: string): Peer[] {
  const byId = new Map<string, { clock: number, peer: Peer }>()
  for (const [client, raw] of states) {
    const s = (raw ?? {}) as State
    const id = s.user?.id
    if (typeof id !== 'string' || id === selfId) continue
    const peer: Peer = {
      id,
      name: typeof s.user?.name === 'string' ? s.user.name : id,
      color: typeof s.user?.color === 'string' && /^#[0-9a-fA-F]{3,8}$/.test(s.user.color) ? s.user.color : '#5f6b7a',
      file: typeof s.file === 'string' ? s.file : null,
      head: s.cursor?.head ?? null,
    }
    // A person with two tabs: the one with a file open wins, then the newer connection.
    const prev = byId.get(id)
    const rank = (p: Peer): number => (p.file ? 1 : 0)
    if (!prev || rank(peer) > rank(prev.peer) || (rank(peer) === rank(prev.peer) && client > prev.clock)) {
      byId.set(id, { clock: client, peer })
    }
  }
  return [...byId.values()].map((v) => v.peer).sort((a, b) => a.name.localeCompare(b.name))
}

/** Two letters for an avatar: "ana.lopez@x" -> "AL", "ana@x" -> "AN". */
/** The text colour readable on `color` (`#rrggbb`): white or black, whichever contrasts
 *  more (one of them always reaches 4.5:1). */
export function inkOn (color: string): string {
  const m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})/i.exec(color)
  if (!m) return '#ffffff'
  const lin = (hex: string): number => {
    const c = parseInt(hex, 16) / 255
    return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4
  }
  const l = 0.2126 * lin(m[1]) + 0.7152 * lin(m[2]) + 0.0722 * lin(m[3])
  const dark = 0 // black's luminance
  return (1.05 / (l + 0.05)) >= ((l + 0.05) / (dark + 0.05)) ? '#ffffff' : '#000000'
}

export function initials (name: string): string {
  const local = name.split('@')[0] ?? name
  const parts = local.split(/[._\-+\s]+/).filter(Boolean)
  const letters = parts.length >= 2 ? parts[0][0] + parts[1][0] : local.slice(0, 2)
  return letters.toUpperCase() || '?'
}

/** The file most of `list` have open (ties: the first by name), if any has one. */
export function busiest (list: readonly Peer[]): string | null {
  const counts = new Map<string, number>()
  for (const p of list) if (p.file) counts.set(p.file, (counts.get(p.file) ?? 0) + 1)
  let best: string | null = null
  for (const [file, n] of [...counts].sort((a, b) => a[0].localeCompare(b[0]))) {
    if (best === null || n > (counts.get(best) ?? 0)) best = file
  }
  return best
}
