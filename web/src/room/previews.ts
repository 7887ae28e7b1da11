// Previews: ports of the room's sandbox served on the preview origin (another host than this
// app, so a preview can never read or set this app's session). The Previews panel lists them
// (state, address, who made it, expiry, requests answered), makes new ones (`publish`; a public
// one waits for someone else's approval, decided inline), revokes them; the preview pane shows
// one beside the terminal in a sandboxed frame.

import { api, type Preview, type Room } from '../api'
import { abilities } from '../caps'
import { action, h, replace, toast, when } from '../dom'

const STATES: Record<Preview['state'], string> = {
  active: 'live',
  pending_approval: 'waiting for approval',
  expired: 'expired',
  revoked: 'revoked',
}

const LIFETIMES: [string, number][] = [['1 hour', 3600], ['8 hours', 8 * 3600], ['1 day', 86_400], ['1 week', 7 * 86_400]]

/** The address to open `p` at: a room preview's carries a one-time link (traded for the preview
 *  origin's own cookie, then removed from the address). */
export async function previewLink (room: string, p: Preview): Promise<string> {
  if (p.visibility === 'public' && p.url) return p.url
  return (await api.openPreview(room, p.id)).url
}

/**
 * The preview pane: a frame of the preview origin. Scripts, forms, popups and the preview's own
 * storage run (it is another origin: it cannot reach this page); it may not navigate this page
 * (no `allow-top-navigation`) nor use camera, microphone or the like (no `allow`).
 */
export class PreviewPane {
  readonly el: HTMLElement
  private readonly frame: HTMLIFrameElement
  private readonly label: HTMLElement
  private shown: Preview | null = null

  /** `changed`: called when a preview is shown or closed. */
  constructor (private readonly room: string, private readonly changed: () => void) {
    this.frame = h('iframe', {
      class: 'preview-frame',
      title: 'Preview',
      sandbox: 'allow-scripts allow-same-origin allow-forms allow-popups allow-popups-to-escape-sandbox allow-modals allow-downloads',
      referrerpolicy: 'no-referrer',
      'data-testid': 'preview-frame',
    }) as HTMLIFrameElement
    this.label = h('span', { class: 'preview-label' })
    this.el = h('section', { class: 'preview-pane', hidden: true, 'aria-label': 'Preview', 'data-testid': 'preview-pane' },
      h('div', { class: 'preview-bar row' }, this.label,
        action('Reload', () => this.reload(), { title: 'Load the preview again' }),
        action('Open in a new tab', () => this.newTab(), { 'data-testid': 'preview-new-tab' }),
        action('Close', () => this.close(), { 'aria-label': 'Close the preview', 'data-testid': 'preview-close' })),
      this.frame)
  }

  get current (): Preview | null { return this.shown }

  async show (p: Preview): Promise<void> {
    const url = await previewLink(this.room, p)
    this.shown = p
    this.label.textContent = `Port ${p.port} (${p.visibility === 'public' ? 'public' : 'room only'})`
    this.frame.src = url
    this.el.hidden = false
    this.changed()
  }

  private async reload (): Promise<void> {
    if (this.shown) await this.show(this.shown)
  }

  private async newTab (): Promise<void> {
    if (!this.shown) return
    window.open(await previewLink(this.room, this.shown), '_blank', 'noopener,noreferrer')
  }

  close (): void {
    this.shown = null
    this.frame.src = 'about:blank'
    this.el.hidden = true
    this.changed()
  }
}

export async function previewsPanel (el: HTMLElement, room: Room, selfId: string, pane: PreviewPane, refresh: () => void): Promise<void> {
  const items = await api.previews(room.id)
  const can = abilities(room.my_capabilities)
  const name = (who: string): string => room.participants.find((p) => p.user_id === who)?.email ?? who

  const row = (p: Preview): HTMLElement => {
    const live = p.state === 'active'
    const own = p.created_by === selfId
    const buttons = h('div', { class: 'row' },
      live ? action('Open here', async () => { await pane.show(p) }, { class: 'primary', 'data-testid': `preview-open-${p.port}` }) : null,
      live ? action('New tab', async () => { window.open(await previewLink(room.id, p), '_blank', 'noopener,noreferrer') }) : null,
      live && p.url ? action('Copy address', async () => {
        await navigator.clipboard.writeText(p.url!)
        toast(p.visibility === 'public' ? 'Copied: anyone with it can open the preview.' : 'Copied: members open it after signing in.')
      }) : null,
      p.state === 'pending_approval' && can.approve && !own && p.approval_id
        ? action('Approve', async () => { await api.decide(room.id, p.approval_id!, true); toast('Approved: the preview is public.'); refresh() },
          { class: 'primary', 'data-testid': `preview-approve-${p.port}` })
        : null,
      p.state === 'pending_approval' && can.approve && !own && p.approval_id
        ? action('Deny', async () => { await api.decide(room.id, p.approval_id!, false); toast('Denied.'); refresh() }, { class: 'danger' })
        : null,
      (live || p.state === 'pending_approval') && can.publish
        ? action('Revoke', async () => {
          await api.revokePreview(room.id, p.id)
          if (pane.current?.id === p.id) pane.close()
          toast(`The preview of port ${p.port} is revoked.`)
          refresh()
        }, { class: 'danger', 'data-testid': `preview-revoke-${p.port}` })
        : null)
    return h('li', { class: `approval ${p.state}`, 'data-testid': 'preview' },
      h('div', null, h('strong', null, `Port ${p.port}`), ' · ', p.visibility === 'public' ? 'public' : 'room only', ' · ',
        h('span', { class: 'state', 'data-testid': 'preview-state' }, STATES[p.state] ?? p.state)),
      h('div', { class: 'hint' }, `by ${name(p.created_by)}, ${p.state === 'pending_approval' ? 'lasts' : 'until'} ${p.state === 'pending_approval' ? `${Math.round(p.ttl_ms / 3_600_000 * 10) / 10} h once approved` : when(p.expires_at)}, ${p.hits} request${p.hits === 1 ? '' : 's'}`),
      p.state === 'pending_approval' && own ? h('p', { class: 'hint' }, 'You asked for this: someone else who holds approve decides.') : null,
      p.url && live ? h('div', { class: 'hint' }, h('code', { class: 'url' }, p.url)) : null,
      buttons)
  }

  const port = h('input', { type: 'number', min: 1, max: 65535, placeholder: '8000', 'aria-label': 'Port', 'data-testid': 'preview-port', class: 'narrow' })
  const visibility = h('select', { 'aria-label': 'Who may open it', 'data-testid': 'preview-visibility' },
    h('option', { value: 'room' }, 'Room members'),
    h('option', { value: 'public' }, 'Anyone with the link (needs approval)'))
  const ttl = h('select', { 'aria-label': 'For how long', 'data-testid': 'preview-ttl' },
    LIFETIMES.map(([label, s]) => h('option', { value: String(s) }, label)))
  // Whether this server serves previews at all (an operator turns them on).
  const on = (await api.ports(room.id).catch(() => null))?.previews !== false
  const create = !on
    ? h('p', { class: 'hint', 'data-testid': 'previews-off' }, 'Previews are off on this server: whoever runs it turns them on (--preview-url).')
    : can.publish
    ? h('div', { class: 'stack' }, h('div', { class: 'row' }, port, visibility, ttl),
      action('Preview', async () => {
        const n = Number(port.value)
        if (!Number.isInteger(n) || n < 1 || n > 65535) { toast('A port is a number from 1 to 65535.', 'error'); return }
        const p = await api.createPreview(room.id, { port: n, visibility: visibility.value as 'room' | 'public', ttl_s: Number(ttl.value) })
        if (p.state === 'pending_approval') toast('Asked: it stays closed until someone else who holds approve agrees.')
        else await pane.show(p)
        refresh()
      }, { class: 'primary', 'data-testid': 'preview-create' }))
    : h('p', { class: 'hint' }, 'Making a preview needs publish.')

  const live = items.filter((p) => p.state === 'active' || p.state === 'pending_approval')
  const past = items.filter((p) => !live.includes(p))
  replace(el,
    h('div', { class: 'panel-head' }, h('h2', null, 'Previews'), action('Refresh', refresh)),
    h('p', { class: 'hint' }, 'A port something in the sandbox listens on, opened on a separate address. Room previews are for members; public ones need an owner\'s approval.'),
    create,
    live.length ? h('ul', { class: 'approvals' }, live.map(row)) : h('p', { class: 'hint' }, 'No previews yet.'),
    past.length ? h('details', null, h('summary', null, `Ended (${past.length})`), h('ul', { class: 'approvals' }, past.map(row))) : null)
}

/**
 * Watches for ports that start listening in the sandbox and offers each once (again if it
 * closes and opens again): `offer` gets the port and its live preview, if it has one. Looking
 * neither starts the sandbox nor keeps it from its idle stop.
 */
export class PortWatch {
  private seen = new Set<number>()
  private timer: ReturnType<typeof setInterval> | null = null

  constructor (
    private readonly room: string,
    private readonly offer: (port: number, preview: Preview | null) => void,
    private readonly closed: (port: number) => void = () => {},
    /** Told, on every look, whether the server serves previews (it may restart with another
     *  configuration). */
    private readonly served: (previews: boolean) => void = () => {},
  ) {}

  start (everyMs: number): void {
    this.timer = setInterval(() => { void this.look() }, everyMs)
    void this.look()
  }

  stop (): void {
    if (this.timer) clearInterval(this.timer)
    this.timer = null
  }

  private async look (): Promise<void> {
    if (document.hidden || this.timer === null) return
    let listening: number[]
    try {
      const seen = await api.ports(this.room)
      this.served(seen.previews !== false)
      // A server without previews offers none (nothing to open a port with).
      listening = seen.previews === false ? [] : seen.listening
    } catch {
      return
    }
    // A port that closes is taken back, and offered again if it opens again.
    for (const p of [...this.seen]) {
      if (!listening.includes(p)) {
        this.seen.delete(p)
        this.closed(p)
      }
    }
    const fresh = listening.filter((p) => !this.seen.has(p))
    if (fresh.length === 0) return
    for (const p of fresh) this.seen.add(p)
    const previews = await api.previews(this.room).catch(() => [] as Preview[])
    for (const port of fresh) {
      const live = previews.find((p) => p.port === port && p.state === 'active') ?? null
      this.offer(port, live)
    }
  }
}
