// What the room's status bar says about the document connection: honest about whether local
// edits have reached the server.

export type Link = 'connecting' | 'connected' | 'disconnected'

export interface ConnView {
  label: string
  kind: 'ok' | 'busy' | 'offline' | 'ended'
}

export class DocConnection {
  link: Link = 'connecting'
  synced = false
  /** Local changes made since the connection was last synced (they are sent on resync). */
  pending = 0
  ended: string | null = null
  /** Why the server last closed the connection, until the next successful sync. */
  problem: string | null = null

  status (link: Link): void {
    // Each retry after losing the connection is an attempt, not news: the page stays offline
    // until one connects (else it would say "Connecting…" while the server is unreachable).
    if (link === 'connecting' && this.link === 'disconnected') return
    this.link = link
    if (link !== 'connected') this.synced = false
  }

  sync (synced: boolean): void {
    this.synced = synced && this.link === 'connected'
    if (this.synced) { this.pending = 0; this.problem = null }
  }

  localEdit (): void {
    if (!this.synced) this.pending++
  }

  refused (reason: string): void {
    this.problem = reason
  }

  end (why: string): void {
    this.ended = why
  }

  view (): ConnView {
    if (this.ended) return { label: this.ended, kind: 'ended' }
    if (this.link === 'connected' && this.synced) return { label: 'Synced', kind: 'ok' }
    const pending = this.pending > 0 ? ` — ${this.pending} local edit${this.pending === 1 ? '' : 's'} not yet sent` : ''
    const why = this.problem ? ` (the server said: ${this.problem})` : ''
    if (this.link === 'disconnected') return { label: `Offline${pending}${why}`, kind: 'offline' }
    return { label: `Connecting…${pending}${why}`, kind: 'busy' }
  }
}

/** What a close code from the server means for a room page: end it, or reconnect. */
export function closeMeaning (code: number): { end: true, message: string } | { end: false } {
  switch (code) {
    case 4001: return { end: true, message: 'You were logged out.' }
    case 4003: return { end: true, message: 'You were removed from this room.' }
    case 4004: return { end: true, message: 'This room was deleted.' }
    default: return { end: false }
  }
}
