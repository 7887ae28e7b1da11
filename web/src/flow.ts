// Flow control and reconnection for the terminal.
//
// A browser cannot pause a WebSocket, so the terminal bounds what it holds instead: output
// waiting to be drawn is counted, and when it passes the high mark the connection is dropped
// and reopened once drawing has caught up. The server then replays its scrollback, so nothing
// that still matters is lost and a flood can never freeze the tab.

export class FlowGate {
  private pending = 0
  constructor (readonly high = 4 << 20, readonly low = 256 << 10) {}

  /** Output arrived; returns false when the viewer should disconnect and catch up later. */
  written (bytes: number): boolean {
    this.pending += bytes
    return this.pending <= this.high
  }

  /** The terminal finished drawing `bytes`. Returns true once below the low mark. */
  drawn (bytes: number): boolean {
    this.pending = Math.max(0, this.pending - bytes)
    return this.pending <= this.low
  }

  get backlog (): number { return this.pending }
}

/** Exponential backoff with a ceiling: 250 ms, 500 ms, ... 10 s. */
export class Backoff {
  private attempt = 0
  constructor (readonly base = 250, readonly max = 10_000) {}
  next (): number {
    const d = Math.min(this.max, this.base * 2 ** this.attempt)
    this.attempt = Math.min(this.attempt + 1, 16)
    return d
  }

  reset (): void { this.attempt = 0 }
}

/** Terminal JSON events from the server. */
export type TermEvent =
  | { type: 'denied', reason: string }
  | { type: 'read_only', reason: string }
  | { type: 'capabilities', capabilities: string[], by?: string }
  | { type: 'typing', user_id: string, email: string }
  | { type: 'people_changed' }
  | { type: 'exit', code?: number | null, reason?: string }
  | { type: 'sandbox', state?: string, reason?: string, [k: string]: unknown }
  | { type: 'error', reason: string }
  | { type: 'floor', holder: FloorPerson | null, requests: FloorPerson[] }
  | { type: 'floor_refused', reason: string, holder: FloorPerson | null }
  | { type: 'spent', reason: string, agent: string | null, meter: string, used: number, budget: number, scope: string }
  | { type: 'budget', agent: string | null, budget: Record<string, number> }
  | { type: 'restored', by: string, checkpoint: string, undo: string }

/** A participant in the terminal's floor events. */
export interface FloorPerson { user_id: string, email: string }

export function parseEvent (text: string): TermEvent | null {
  try {
    const v = JSON.parse(text) as { type?: unknown }
    return typeof v === 'object' && v !== null && typeof v.type === 'string' ? v as TermEvent : null
  } catch {
    return null
  }
}
