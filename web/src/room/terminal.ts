// The shared terminal: xterm.js joined to the room's PTY over /api/rooms/{id}/terminal.

import { Terminal } from '@xterm/xterm'
import { FitAddon } from '@xterm/addon-fit'
import '@xterm/xterm/css/xterm.css'
import { h } from '../dom'
import { Backoff, FlowGate, parseEvent, type FloorPerson, type TermEvent } from '../flow'
import { closeMeaning } from '../conn'
import { wsUrl } from '../api'

export interface TerminalHooks {
  event: (e: TermEvent) => void
  /** Keys the page handles itself (its shortcuts); the terminal leaves them alone. */
  isShortcut: (e: KeyboardEvent) => boolean
  /** The server ended this membership (removed, deleted, logged out). */
  ended: (message: string) => void
  /** This participant's user id (to tell their own floor from others'). */
  selfId: string
  /** How a participant is shown. */
  name: (p: FloorPerson) => string
  /** Controls the page puts in the terminal's bar (Run and Stop). */
  toolbar?: HTMLElement
}

export class SharedTerminal {
  readonly term: Terminal
  private readonly fit = new FitAddon()
  private ws: WebSocket | null = null
  private readonly gate = new FlowGate()
  // Back within a second or two of the server (a restart is seconds long; a longer outage costs
  // a request every 1.5 s).
  private readonly backoff = new Backoff(250, 1500)
  private catchingUp = false
  private retry: ReturnType<typeof setTimeout> | null = null
  private closed = false
  private canType = false
  private readonly status: HTMLElement
  private readonly badge: HTMLElement
  /** Who has the terminal (taken with "Take control") and who asked for it. */
  private floor: { holder: FloorPerson | null, requests: FloorPerson[] } = { holder: null, requests: [] }
  private readonly floorEl: HTMLElement
  private readonly observer: ResizeObserver
  private readonly encoder = new TextEncoder()

  constructor (readonly el: HTMLElement, private readonly roomId: string, private readonly hooks: TerminalHooks) {
    this.term = new Terminal({
      convertEol: false,
      cursorBlink: true,
      scrollback: 5000,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
      fontSize: 13,
      disableStdin: true,
      theme: { background: '#1b1e23' },
    })
    this.term.loadAddon(this.fit)
    const screen = h('div', { class: 'term-screen', 'data-testid': 'terminal' })
    this.status = h('span', { class: 'term-status', 'data-testid': 'terminal-status' }, 'Connecting…')
    this.badge = h('span', { class: 'badge view-only', 'data-testid': 'terminal-view-only', hidden: true }, 'View only: you cannot type here')
    this.floorEl = h('span', { class: 'term-floor', 'data-testid': 'terminal-floor' })
    el.append(h('div', { class: 'term-bar' }, h('strong', null, 'Terminal'), hooks.toolbar ?? null, this.badge, this.floorEl, this.status), screen)
    this.term.open(screen)
    this.term.onData((data) => this.send(data, false))
    // With stdin disabled xterm drops keys silently: say why nothing happens.
    this.term.attachCustomKeyEventHandler((e) => {
      // The page's shortcuts (and Ctrl+S, which would send XOFF and freeze the shared shell
      // for everyone) go to the page, not the shell.
      if (this.hooks.isShortcut(e)) return false
      if (!this.canType && e.type === 'keydown') this.flash('View only: your keys are not sent')
      return true
    })
    this.term.onBinary((data) => this.send(data, false))
    this.observer = new ResizeObserver(() => this.resize())
    this.observer.observe(screen)
    this.connect()
  }

  setCanType (can: boolean): void {
    this.canType = can
    this.term.options.disableStdin = !can
    this.badge.hidden = can
    this.el.classList.toggle('read-only', !can)
    if (can) this.sendSize()
    this.renderFloor()
  }

  /** Takes, asks for, releases or hands on the terminal (one driver at a time). */
  private floorAction (action: 'take' | 'request' | 'release' | 'give', to?: string): void {
    if (this.ws?.readyState !== WebSocket.OPEN) return
    this.ws.send(JSON.stringify(to ? { type: 'floor', action, to } : { type: 'floor', action }))
  }

  private renderFloor (): void {
    const { holder, requests } = this.floor
    const mine = holder?.user_id === this.hooks.selfId
    const asked = requests.some((r) => r.user_id === this.hooks.selfId)
    const button = (label: string, testid: string, onclick: () => void): HTMLElement =>
      h('button', { type: 'button', class: 'small', 'data-testid': testid, onclick }, label)
    const parts: Array<HTMLElement | string> = []
    if (holder === null) {
      if (this.canType) parts.push(button('Take control', 'floor-take', () => this.floorAction('take')))
    } else if (mine) {
      parts.push(h('span', { class: 'floor-holder', 'data-testid': 'floor-holder' }, 'You have control'))
      parts.push(button('Release', 'floor-release', () => this.floorAction('release')))
      for (const r of requests) {
        parts.push(h('span', { class: 'floor-request', 'data-testid': 'floor-request' },
          `${this.hooks.name(r)} asks for control `,
          button('Hand over', 'floor-give', () => this.floorAction('give', r.user_id))))
      }
    } else {
      parts.push(h('span', { class: 'floor-holder', 'data-testid': 'floor-holder' }, `${this.hooks.name(holder)} has control`))
      if (asked) {
        parts.push(h('span', { class: 'hint', 'data-testid': 'floor-asked' }, 'You asked for control'))
        parts.push(button('Cancel', 'floor-cancel', () => this.floorAction('release')))
      } else if (this.canType) {
        parts.push(button('Request control', 'floor-request-button', () => this.floorAction('request')))
      }
    }
    this.floorEl.replaceChildren(...parts)
  }

  focus (): void { this.term.focus() }

  /** Types `command` and Enter into the shared shell, as this person's keys (the server checks
   *  `type` and the floor as for any key). False when nothing could be sent. */
  runLine (command: string): boolean {
    return this.send(`${command}\r`)
  }

  /** Ctrl-C to the shell: stops what runs in the foreground. */
  interrupt (): boolean {
    return this.send('\x03')
  }

  /** Sends this person's keys. `sayOffline`: say so when not connected (a typed key is dropped
   *  quietly: the status line already says the terminal is reconnecting). */
  private send (data: string, sayOffline = true): boolean {
    if (!this.canType) {
      this.flash('View only: your keys are not sent')
      return false
    }
    if (this.ws?.readyState !== WebSocket.OPEN) {
      if (sayOffline) this.flash('Not connected yet: try again in a moment')
      return false
    }
    this.ws.send(this.encoder.encode(data))
    return true
  }

  private flash (text: string): void {
    this.status.textContent = text
    this.refusedShown = false
  }

  /** The bar shows a floor refusal (someone else has the terminal). */
  private refusedShown = false

  private resize (): void {
    try { this.fit.fit() } catch { /* not laid out yet */ }
    this.sendSize()
  }

  private sendSize (): void {
    if (this.canType && this.ws?.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify({ type: 'resize', cols: this.term.cols, rows: this.term.rows }))
    }
  }

  private connect (): void {
    if (this.closed) return
    try { this.fit.fit() } catch { /* not laid out yet */ }
    const url = wsUrl(`/api/rooms/${this.roomId}/terminal?cols=${this.term.cols}&rows=${this.term.rows}`)
    const ws = new WebSocket(url)
    ws.binaryType = 'arraybuffer'
    this.ws = ws
    let fresh = true
    // The backoff starts over only once the server has said something: a socket that is
    // accepted and closed at once (the sandbox is unavailable) keeps backing off.
    let heard = false
    const heardFrom = (): void => {
      if (heard) return
      heard = true
      this.backoff.reset()
    }
    // Connected means a shell takes keys: the server says so (`sandbox` `running`) once the
    // sandbox has started or resumed and its terminal is open; until then it says `starting`.
    ws.onopen = () => { this.flash('Connecting…') }
    ws.onmessage = (m) => {
      // A replaced connection's last frames are stale: the new one replays the scrollback.
      if (this.ws !== ws) return
      if (typeof m.data === 'string') {
        const e = parseEvent(m.data)
        // An error before a close (the sandbox is unavailable) is not a working connection.
        if (e && e.type !== 'error') heardFrom()
        if (e) this.onEvent(e)
        return
      }
      heardFrom()
      if (fresh) {
        // The scrollback replay follows: start from a clean screen. In-band (RIS), so output
        // of an earlier connection still queued for drawing is drawn first, then cleared.
        this.term.write('\x1bc')
        fresh = false
      }
      const bytes = new Uint8Array(m.data as ArrayBuffer)
      if (!this.gate.written(bytes.length) && !this.catchingUp) {
        // Drawing fell too far behind: stop receiving, reconnect once caught up.
        this.catchingUp = true
        this.flash('Catching up…')
        ws.close(1000, 'catching up')
      }
      this.term.write(bytes, () => {
        this.gate.drawn(bytes.length)
        // Reconnect once everything queued is drawn, so the replay starts from a clean slate.
        if (this.catchingUp && this.gate.backlog === 0 && !this.closed) {
          this.catchingUp = false
          this.connect()
        }
      })
    }
    ws.onclose = (e) => {
      if (this.ws !== ws) return
      this.ws = null
      if (this.closed) return
      const meaning = closeMeaning(e.code)
      // Closed by us to catch up: the reconnect is already arranged (unless the server ended
      // the membership meanwhile).
      if (this.catchingUp && !meaning.end) return
      if (meaning.end) {
        this.catchingUp = false
        this.flash(meaning.message)
        this.closed = true
        this.hooks.ended(meaning.message)
        return
      }
      // 4008: we fell behind on the server's side; catch up from the scrollback at once.
      // 1011: the sandbox is unavailable; no point asking more than every few seconds.
      const delay = e.code === 4008 ? 0 : e.code === 1011 ? Math.max(3000, this.backoff.next()) : this.backoff.next()
      const why = e.reason ? `${e.reason}; ` : ''
      this.flash(`Disconnected (${why}reconnecting in ${Math.round(delay / 100) / 10} s)`)
      this.retry = setTimeout(() => this.connect(), delay)
    }
  }

  private onEvent (e: TermEvent): void {
    switch (e.type) {
      case 'denied': this.flash(`Refused: ${e.reason}`); break
      case 'floor':
        this.floor = { holder: e.holder, requests: e.requests }
        // A refusal shown in the bar is over once the floor is free or this person's.
        if (this.refusedShown && (e.holder === null || e.holder.user_id === this.hooks.selfId)) this.flash('Connected')
        this.renderFloor()
        break
      case 'floor_refused': this.flash(e.reason); this.refusedShown = true; break
      case 'error': this.flash(e.reason); break
      case 'sandbox':
        if (e.state === 'starting') this.flash('Starting the sandbox…')
        else if (e.state === 'running') this.flash('Connected')
        else if (e.state === 'preparing') this.flash('Connected — preparing the workspace…')
        else if (e.state === 'ready') this.flash('Connected — ready')
        else if (e.state === 'not_ready') this.flash(`Connected — not ready: ${e.reason ?? 'the readiness step failed'}`)
        break
      case 'exit':
        this.term.write(e.reason
          ? `\r\n\x1b[2m[the sandbox stopped: ${e.reason}]\x1b[0m\r\n`
          : `\r\n\x1b[2m[the shell exited${e.code != null ? ` with ${e.code}` : ''}; type to start a new one]\x1b[0m\r\n`)
        break
      default: break
    }
    this.hooks.event(e)
  }

  /** Stops for good, keeping what the screen shows. */
  stop (message: string): void {
    this.closed = true
    this.catchingUp = false
    if (this.retry) clearTimeout(this.retry)
    this.retry = null
    const ws = this.ws
    this.ws = null
    ws?.close(1000, 'left the room')
    this.setCanType(false)
    this.flash(message)
  }

  destroy (): void {
    this.stop('')
    this.observer.disconnect()
    this.term.dispose()
  }
}
