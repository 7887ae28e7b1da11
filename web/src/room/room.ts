// The room: file tree, editor tabs, shared terminal, and the side panels, all following the
// participant's rights as they change.

import * as Y from 'yjs'
import * as decoding from 'lib0/decoding'
import * as encoding from 'lib0/encoding'
import * as syncProtocol from 'y-protocols/sync'
import { WebsocketProvider } from 'y-websocket'
import { api, ApiError, wsUrl, type Approval, type Capability, type Room } from '../api'
import type { App } from '../main'
import { abilities } from '../caps'
import { DocConnection, closeMeaning } from '../conn'
import { asText, buildTree, checkPath, folderMoves, freePath, MAX_TEXT_BYTES, movedTo, quickMatches, searchFiles, type TreeNode } from '../files'
import { action, errorText, h, notice, replace, toast } from '../dom'
import { Editor } from './editor'
import { SharedTerminal } from './terminal'
import { peoplePanel } from './people'
import { approvalsPanel, auditPanel, roomPanel, sandboxPanel } from './panels'
import { checkpointsPanel } from './checkpoints'
import { secretsPanel } from './secrets'
import { networkPanel } from './network'
import { reposPanel } from './repos'
import { PortWatch, PreviewPane, previewsPanel } from './previews'
import { spendPanel } from './spend'
import { keep, putBack, watchEdits } from './kept'
import { MANIFEST, checkCommand, runCommand, withManifestCommand, type RunCommand } from '../run'
import { askedNotice, decisionNotice, rightsNotice, whoIs } from '../notices'
import { busiest, initials, inkOn, peers, type Peer } from '../presence'
import { browserStore, clampFiles, clampTerm, loadLayout, loadTabs, MAX_FILES_PX, MIN_FILES_PX, saveLayout, saveTabs, splitAt } from '../layout'

/**
 * What this page had when the server said it did not keep our latest changes (a full room, or
 * edit withdrawn): a Y.Doc cannot take back its own edits, so the room page starts again from
 * the server's copy and shows these, to copy from.
 */
let notKept: {
  room: string
  reason: string
  texts: Map<string, string>
  /** The open tabs and the active one, reopened once the page has synced again. */
  tabs: string[]
  active: string | null
  /** When it was kept: a restart overtaken by another navigation must not show it later. */
  at: number
} | null = null

const PANELS = ['People', 'Approvals', 'Sandbox', 'Checkpoints', 'Secrets', 'Network', 'Repos', 'Audit', 'Room', 'Previews', 'Spend'] as const
type Panel = typeof PANELS[number]
/** The side panels in groups, so the panel bar is two short rows instead of three long ones:
 *  who is here and what they did; what runs; the room's code; what the room allows. */
const GROUPS: ReadonlyArray<readonly [string, readonly Panel[]]> = [
  ['Team', ['People', 'Approvals', 'Audit']],
  ['Running', ['Sandbox', 'Previews']],
  ['Code', ['Checkpoints', 'Repos']],
  ['Settings', ['Room', 'Secrets', 'Network', 'Spend']],
]
const groupOf = (p: Panel): string => GROUPS.find(([, ps]) => ps.includes(p))?.[0] ?? 'Team'
const POLL_MS = 5000
/** How long others' names stay shown over their carets after an edit of theirs. */
const NAMES_SHOWN_MS = 3000
/** How long a newcomer's page waits for the others' presence to open the busiest file. */
const LANDING_MS = 3000
/** How often the room looks for newly listening ports. */
const PORTS_MS = 3000
const MAC = /Mac|iPhone|iPad/.test(navigator.userAgent)
/** How long the document must be quiet before Run types the command (the sandbox's file sync
 *  writes an edit 150 ms after the last one; a margin over that). */
const RUN_QUIET_MS = 400

export function roomPage (app: App, id: string): () => void {
  const me = app.me!
  const disposers: (() => void)[] = []
  /** Set when the page is left: late timers and answers must not touch what was torn down. */
  let disposed = false
  let ended = false
  // What stops when the room ends here (removed, deleted): nothing keeps asking the server.
  const onEnd: Array<() => void> = []
  let room: Room | null = null
  let caps: Capability[] = []
  /** Counts pushed rights changes, so an older poll answer cannot undo a newer push. */
  let capsEpoch = 0
  let panel: Panel = 'People'
  const online = new Set<string>()
  const typing = new Map<string, number>()
  const typingTimers = new Map<string, ReturnType<typeof setTimeout>>()
  const armedRemovals = new Map<string, number>()
  const detailedRights = new Set<string>()

  const title = document.getElementById('room-title')
  const connStatus = h('span', { class: 'conn', 'data-testid': 'conn-status', role: 'status' }, 'Connecting…')
  const banner = h('div', { class: 'room-ended', hidden: true, role: 'alert', 'data-testid': 'room-ended' })
  // The server restarted with another configuration (previews turned on or off, this person
  // made or unmade an admin): the page says what changed and offers a reload, which shows
  // what the server offers now.
  const configNotice = h('div', { class: 'port-notice config-notice row', hidden: true, role: 'status', 'data-testid': 'config-changed' })
  const fullNotice = h('div', { class: 'room-full', hidden: true, role: 'alert', 'data-testid': 'room-full' })
  const portNotice = h('div', { class: 'port-notice row', hidden: true, role: 'status', 'data-testid': 'port-notice' })
  const deletionNotice = h('div', { class: 'deletion-notice', hidden: true, role: 'status', 'data-testid': 'pending-deletion' })
  // A preview sits beside the editor (in narrow windows, in its place).
  const pane = new PreviewPane(id, () => {
    work.classList.toggle('with-preview', pane.current !== null)
    if (panel === 'Previews') renderSide()
  })
  const tree = h('ul', { class: 'tree', role: 'tree', 'aria-label': 'Files' })
  const treeEmpty = h('p', { class: 'hint tree-empty' }, 'No files yet.')
  // Deleted files, newest first, each restorable by those who may edit.
  const trashList = h('ul', { class: 'trash-list', 'data-testid': 'trash-list' })
  const trashBox = h('details', { class: 'trash', 'data-testid': 'trash' }, h('summary', null, 'Deleted files'), trashList) as HTMLDetailsElement
  const treeTools = h('div', { class: 'tree-tools' })
  const tabs = h('div', { class: 'tabs', role: 'toolbar', 'aria-label': 'Open files' })
  const editorEl = h('div', { class: 'editor', 'data-testid': 'editor' })
  const empty = h('div', { class: 'editor-empty hint' }, 'Open a file from the tree, or create one (Alt+N).')
  const termEl = h('section', { class: 'terminal', 'aria-label': 'Shared terminal' })
  const sideGroups = h('div', { class: 'side-groups', role: 'group', 'aria-label': 'Panel groups' })
  const sideNav = h('div', { class: 'side-nav', role: 'tablist', 'aria-label': 'Panels' })
  const sideBody = h('div', { class: 'side-body' })
  const split = h('div', {
    class: 'split', role: 'separator', 'aria-orientation': 'horizontal', tabindex: '0',
    'aria-label': 'Terminal height: drag, or use the arrow keys', 'data-testid': 'split',
  })
  const work = h('section', { class: 'work' }, tabs, pane.el, editorEl, empty, split, termEl)
  // The file tree's right edge: drag it (or use the arrow keys) to make the tree wider.
  const filesSplit = h('div', {
    class: 'files-split', role: 'separator', 'aria-orientation': 'vertical', tabindex: '0',
    'aria-label': 'File tree width: drag, or use the arrow keys', 'aria-valuemin': String(MIN_FILES_PX),
    'aria-valuemax': String(MAX_FILES_PX), 'data-testid': 'files-split',
  })
  const sideToggle = h('button', { type: 'button', class: 'side-toggle icon', 'data-testid': 'side-toggle' })
  const layout = h('div', { class: 'room' },
    h('aside', { class: 'files' }, h('div', { class: 'panel-head' }, h('h2', null, 'Files'), treeTools), tree, treeEmpty, trashBox),
    filesSplit,
    work,
    h('aside', { class: 'side' }, sideToggle, h('nav', { class: 'side-navs', 'aria-label': 'Side panels' }, sideGroups, sideNav), sideBody))
  replace(app.main, deletionNotice, banner, configNotice, fullNotice, portNotice, layout)
  title?.append(connStatus)

  // The layout as this person left it: the terminal's height (or filling the work area), the
  // side panel shown or folded away.
  const store = browserStore()
  const prefs = loadLayout(store, me.id)
  const maxButton = h('button', { type: 'button', class: 'small', 'data-testid': 'term-max' })
  const applyLayout = (): void => {
    if (prefs.termPx !== null) work.style.setProperty('--term-h', `${prefs.termPx}px`)
    work.classList.toggle('term-max', prefs.termMax)
    split.hidden = prefs.termMax
    maxButton.textContent = prefs.termMax ? 'Restore' : 'Maximise'
    maxButton.setAttribute('aria-pressed', String(prefs.termMax))
    layout.classList.toggle('side-hidden', prefs.sideHidden)
    sideToggle.textContent = prefs.sideHidden ? '‹' : '›'
    sideToggle.setAttribute('aria-expanded', String(!prefs.sideHidden))
    sideToggle.setAttribute('aria-label', prefs.sideHidden ? 'Show the side panel' : 'Hide the side panel')
    sideToggle.title = sideToggle.getAttribute('aria-label') ?? ''
    split.setAttribute('aria-valuenow', String(prefs.termPx ?? termEl.offsetHeight))
    if (prefs.filesPx !== null) layout.style.setProperty('--files-w', `${prefs.filesPx}px`)
    filesSplit.setAttribute('aria-valuenow', String(prefs.filesPx ?? 220))
  }
  const keepLayout = (): void => { applyLayout(); saveLayout(store, me.id, prefs) }
  maxButton.addEventListener('click', () => { prefs.termMax = !prefs.termMax; keepLayout() })
  sideToggle.addEventListener('click', () => { prefs.sideHidden = !prefs.sideHidden; keepLayout() })
  const workSpan = (): { top: number, bottom: number } => {
    const r = work.getBoundingClientRect()
    return { top: r.top + tabs.offsetHeight, bottom: r.bottom }
  }
  /** Makes `handle` a drag handle: `move` gets each pointer position while dragging, `step`
   *  each arrow key (+1 or -1, `grow` names the key that is +1); the layout is kept after. */
  const dragHandle = (handle: HTMLElement, grow: string, shrink: string, move: (e: PointerEvent) => void, step: (by: number) => void): void => {
    handle.addEventListener('pointerdown', (e) => {
      handle.setPointerCapture(e.pointerId)
      handle.classList.add('dragging')
      e.preventDefault()
    })
    handle.addEventListener('pointermove', (e) => {
      if (!handle.hasPointerCapture(e.pointerId)) return
      move(e)
      applyLayout()
    })
    const end = (e: PointerEvent): void => {
      if (!handle.hasPointerCapture(e.pointerId)) return
      handle.releasePointerCapture(e.pointerId)
      handle.classList.remove('dragging')
      keepLayout()
    }
    handle.addEventListener('pointerup', end)
    handle.addEventListener('pointercancel', end)
    handle.addEventListener('keydown', (e) => {
      const by = e.key === grow ? 1 : e.key === shrink ? -1 : 0
      if (!by) return
      e.preventDefault()
      step(by)
      keepLayout()
    })
  }
  dragHandle(split, 'ArrowUp', 'ArrowDown', (e) => {
    const { top, bottom } = workSpan()
    prefs.termPx = splitAt(e.clientY, top, bottom)
  }, (by) => {
    const { top, bottom } = workSpan()
    prefs.termPx = clampTerm((prefs.termPx ?? termEl.offsetHeight) + 24 * by, bottom - top)
  })
  dragHandle(filesSplit, 'ArrowRight', 'ArrowLeft', (e) => {
    prefs.filesPx = clampFiles(e.clientX - layout.getBoundingClientRect().left)
  }, (by) => {
    prefs.filesPx = clampFiles((prefs.filesPx ?? 220) + 24 * by)
  })
  applyLayout()

  // The document and its connection.
  const doc = new Y.Doc()
  const files = doc.getMap<Y.Text>('files')
  const conn = new DocConnection()
  const provider = new WebsocketProvider(wsUrl(`/api/rooms/${id}`), 'doc', doc, {
    shouldReconnect: (e: CloseEvent) => !closeMeaning(e.code).end,
  })
  provider.awareness.setLocalStateField('user', { name: me.email, id: me.id })
  // The server did not keep our latest changes (a full room, or edit withdrawn): it says so with
  // y-protocols' permission-denied message (type 2) and keeps the connection. The page keeps
  // what it had, to show, and starts again from the server's copy, so it shows what everyone
  // else sees (y-websocket's own handler only logs the message).
  let restarting = false
  provider.messageHandlers[2] = (_encoder, decoder) => {
    if (decoding.readVarUint(decoder) !== 0 || restarting || disposed) return
    restarting = true
    const texts = new Map<string, string>()
    files.forEach((t, p) => { if (t instanceof Y.Text) texts.set(p, t.toString()) })
    notKept = { room: id, reason: decoding.readVarString(decoder), texts, tabs: [...open], active, at: Date.now() }
    app.reload()
  }
  // Back from such a restart: once synced, show what was not kept, file by file.
  const carried = notKept?.room === id && Date.now() - notKept.at < 10_000 ? notKept : null
  notKept = null
  if (carried) {
    fullNotice.textContent = carried.reason
    fullNotice.hidden = false
    const showNotKept = (synced: boolean): void => {
      if (!synced || disposed) return
      provider.off('sync', showNotKept)
      // The tabs that were open come back, the active one last.
      for (const p of carried.tabs) if (p !== carried.active) openFile(p)
      if (carried.active) openFile(carried.active)
      const lost = [...carried.texts].filter(([p, text]) => files.get(p)?.toString() !== text)
      if (lost.length === 0) return
      fullNotice.append(h('div', { class: 'not-kept', 'data-testid': 'not-kept' },
        h('p', null, 'Not kept (copy what you need):'),
        ...lost.map(([p, text]) => h('details', null, h('summary', null, p),
          h('textarea', { readonly: true, rows: 4, 'data-testid': `not-kept-${p}` }, text))),
        h('button', { type: 'button', onclick: () => { fullNotice.hidden = true } }, 'Dismiss')))
    }
    provider.on('sync', showNotKept)
  }
  const showConn = (): void => {
    const v = conn.view()
    connStatus.textContent = v.label
    connStatus.className = `conn ${v.kind}`
  }
  provider.on('status', ({ status }: { status: 'connected' | 'disconnected' | 'connecting' }) => { conn.status(status); showConn() })
  provider.on('sync', (synced: boolean) => { conn.sync(synced); showConn() })
  provider.on('connection-close', (e: CloseEvent | null) => {
    const m = e ? closeMeaning(e.code) : { end: false as const }
    if (m.end) end(m.message)
    else if (e && e.code >= 1002 && e.code !== 1006 && e.reason) { conn.refused(e.reason); showConn() }
  })
  // A round trip to the room: resolved by the room's answer to a sync step 1 sent once the
  // page is synced. The room answers after applying everything the page sent before it, so
  // by then what it did about those updates (typing carried into a renamed file, a deleted
  // file brought back) has arrived too.
  let roundTrips: Array<() => void> = []
  const syncHandler = provider.messageHandlers[0]
  provider.messageHandlers[0] = (encoder, decoder, prov, emitSynced, messageType) => {
    const kind = decoding.readVarUint(decoding.clone(decoder))
    syncHandler(encoder, decoder, prov, emitSynced, messageType)
    if (kind === syncProtocol.messageYjsSyncStep2 && provider.synced) {
      const due = roundTrips
      roundTrips = []
      for (const f of due) f()
    }
  }
  const askRoom = (): void => {
    const ws = provider.ws
    if (!ws || !provider.wsconnected) return
    const e = encoding.createEncoder()
    encoding.writeVarUint(e, 0)
    syncProtocol.writeSyncStep1(e, doc)
    ws.send(encoding.toUint8Array(e))
  }
  const roundTrip = (): Promise<void> => new Promise((resolve) => {
    roundTrips.push(resolve)
    // Not synced (reconnecting): the sync that ends it answers.
    if (provider.synced) askRoom()
  })
  let lastLocalEdit = 0
  doc.on('update', (_u: Uint8Array, origin: unknown) => {
    if (origin !== provider) { lastLocalEdit = Date.now(); conn.localEdit(); showConn() }
  })
  disposers.push(() => { provider.destroy(); doc.destroy() })

  // Editor and tabs.
  const editor = new Editor(editorEl, provider.awareness)
  disposers.push(() => editor.destroy())
  const open: string[] = []
  let active: string | null = null
  /** Everyone else in the room now, with where they are. */
  const here = (): Peer[] => peers(provider.awareness.getStates(), me.id)
  // The tabs this person had open here come back once the document has synced (until then
  // nothing is saved over them).
  let tabsRestored = carried !== null
  const restoreTabs = (synced: boolean): void => {
    if (!synced || disposed || tabsRestored) return
    provider.off('sync', restoreTabs)
    tabsRestored = true
    const saved = loadTabs(store, id, me.id)
    // In their order, the active one last to be opened.
    for (const p of saved.open) openFile(p)
    if (saved.active) openFile(saved.active)
    // New here (nothing open before): the file the others are busiest in, as soon as their
    // presence arrives (it may follow the document's sync), unless this person opened one.
    const land = (): boolean => {
      if (open.length > 0) return true
      const where = busiest(here())
      if (where) openFile(where)
      return where !== null
    }
    if (!land()) {
      const onChange = (): void => { if (land()) stop() }
      const stop = (): void => { provider.awareness.off('change', onChange); clearTimeout(give) }
      const give = setTimeout(stop, LANDING_MS)
      provider.awareness.on('change', onChange)
      disposers.push(stop)
    }
    renderTabs()
  }
  provider.on('sync', restoreTabs)
  const openFile = (path: string): void => {
    const text = files.get(path)
    if (!(text instanceof Y.Text)) return
    if (path !== active && orphan === null && editor.detachedTyping()?.typed) {
      // What was typed since the open file left is still to be placed (the room has not
      // answered yet): switching now would drop it.
      toast('A moment: what you typed is being put into the file it became.')
      return
    }
    if (orphan !== null) {
      const i = open.indexOf(orphan)
      if (i >= 0) open.splice(i, 1)
      orphan = null
    }
    if (!open.includes(path)) open.push(path)
    active = path
    editor.open(path, text)
    provider.awareness.setLocalStateField('file', path)
    editor.setEditable(caps.includes('edit') && !ended)
    renderTabs()
    renderTree()
  }
  /** A file chosen by this person: beside the preview, or, in a narrow window, in its place. */
  const pick = (path: string): void => {
    if (pane.current && window.matchMedia('(max-width: 900px)').matches) pane.close()
    openFile(path)
  }
  const closeTab = (path: string): void => {
    if (path === orphan) orphan = null
    const i = open.indexOf(path)
    if (i >= 0) open.splice(i, 1)
    if (active === path) {
      editor.close()
      active = null
      provider.awareness.setLocalStateField('file', null)
      const next = open[Math.min(i, open.length - 1)]
      if (next) { openFile(next); return }
    }
    renderTabs()
    renderTree()
  }
  // Who else has which file open: small avatars on its tab and in the tree.
  let peerFiles = new Map<string, Peer[]>()
  const whoIsWhere = (): Map<string, Peer[]> => {
    const m = new Map<string, Peer[]>()
    for (const p of here()) if (p.file) m.set(p.file, [...(m.get(p.file) ?? []), p])
    return m
  }
  const hereIn = (path: string): HTMLElement | null => {
    const list = peerFiles.get(path)
    if (!list?.length) return null
    const names = list.map((p) => p.name).join(', ')
    return h('span', { class: 'here', title: `${names} ${list.length === 1 ? 'has' : 'have'} it open`, 'aria-label': `open by ${names}`, 'data-testid': `here-${path}` },
      list.map((p) => h('span', { class: 'mini-avatar', style: `background:${p.color};color:${inkOn(p.color)}` }, initials(p.name))))
  }
  const renderTabs = (): void => {
    if (tabsRestored) saveTabs(store, id, me.id, { open, active })
    peerFiles = whoIsWhere()
    empty.hidden = active !== null
    editorEl.hidden = active === null
    // Each tab holds two buttons (open, close), so it is a group, not an ARIA tab (which may
    // not hold controls); the open file's button says it is the current one.
    replace(tabs, open.map((p) => h('div', { class: `tab ${p === active ? 'active' : ''}`, role: 'group', 'aria-label': p },
      h('button', { type: 'button', class: `tab-name${p === orphan ? ' deleted' : ''}`, onclick: () => pick(p), title: p === orphan ? `${p} (deleted: type to bring it back)` : p, 'aria-current': p === active ? 'true' : null }, p.split('/').pop(), p === orphan ? ' (deleted)' : ''),
      hereIn(p),
      h('button', { type: 'button', class: 'tab-x', onclick: () => closeTab(p), 'aria-label': `Close ${p}` }, '×'))))
  }

  // File tree, with create / rename / delete for editors.
  /** A one-line form for editors: `parse` reads the text (a value, or why it cannot be one),
   *  `done` uses the value (or says why it cannot). Escape closes it; so does losing `edit`. */
  const lineForm = <T>(o: {
    label: string, initial: string, placeholder: string, testid: string, class: string, submit?: string,
    parse: (raw: string) => { ok: true, value: T } | { ok: false, reason: string },
    done: (value: T) => string | undefined,
  }): HTMLFormElement => {
    const input = h('input', { value: o.initial, 'aria-label': o.label, placeholder: o.placeholder, 'data-testid': o.testid })
    const err = h('p', { class: 'error', role: 'alert' })
    const form = h('form', { class: o.class }, input, o.submit ? h('button', { type: 'submit', class: 'small' }, o.submit) : null, err)
    form.addEventListener('submit', (e) => {
      e.preventDefault()
      if (!caps.includes('edit') || ended) { form.remove(); return }
      const r = o.parse(input.value)
      if (!r.ok) { err.textContent = r.reason; return }
      const refused = o.done(r.value)
      if (refused) { err.textContent = refused; return }
      form.remove()
    })
    input.addEventListener('keydown', (e) => { if (e.key === 'Escape') form.remove() })
    return form
  }
  /** A path field; `done` gets a valid path, or returns why it cannot be used. */
  const fileForm = (label: string, initial: string, done: (path: string) => string | undefined): HTMLFormElement =>
    lineForm({
      label, initial, placeholder: 'src/main.rs', testid: 'file-path', class: 'file-form stack', done,
      parse: (raw) => { const r = checkPath(raw); return r.ok ? { ok: true, value: r.path } : r },
    })
  const newFile = (): void => {
    if (!caps.includes('edit') || ended) return
    tree.parentElement?.querySelector('.file-form')?.remove()
    const form = fileForm('New file path', '', (path) => {
      if (files.has(path)) return `${path} already exists`
      files.set(path, new Y.Text(''))
      openFile(path)
      editor.focus()
      return undefined
    })
    tree.before(form)
    form.querySelector('input')?.focus()
  }
  // Upload: text files from this computer become files of the room (under their own names;
  // one that exists is left alone, never overwritten).
  const uploadInput = h('input', { type: 'file', multiple: true, hidden: true, 'data-testid': 'upload-input' })
  uploadInput.addEventListener('change', async () => {
    const chosen = Array.from(uploadInput.files ?? [])
    uploadInput.value = ''
    for (const f of chosen) {
      const path = checkPath(f.name)
      if (!path.ok) { toast(`${f.name}: ${path.reason}`, 'error'); continue }
      if (files.has(path.path)) { toast(`${path.path} already exists: rename it first, or the upload.`, 'error'); continue }
      if (f.size > MAX_TEXT_BYTES) { toast(`${f.name} is larger than 1 MiB.`, 'error'); continue }
      const read = asText(new Uint8Array(await f.arrayBuffer()))
      if (!read.ok) { toast(`${f.name} ${read.reason}: only text files go into the room.`, 'error'); continue }
      if (!caps.includes('edit') || ended) return
      files.set(path.path, new Y.Text(read.text))
      openFile(path.path)
    }
  })
  layout.append(uploadInput)
  /** Saves `path`'s text as a file on this computer. */
  const download = (path: string): void => {
    const t = files.get(path)
    if (!(t instanceof Y.Text)) return
    const url = URL.createObjectURL(new Blob([t.toString()], { type: 'text/plain;charset=utf-8' }))
    const a = h('a', { href: url, download: path.split('/').pop() ?? path })
    document.body.append(a)
    a.click()
    a.remove()
    setTimeout(() => URL.revokeObjectURL(url), 10_000)
  }
  const rename = (from: string): void => {
    tree.parentElement?.querySelector('.file-form')?.remove()
    const form = fileForm(`Rename ${from} to`, from, (to) => {
      if (files.has(to)) return `${to} already exists`
      const old = files.get(from)
      const text = new Y.Text(old instanceof Y.Text ? old.toString() : '')
      // Read before the change: the map's observer runs inside the transaction and closes the
      // old path's tab.
      const wasActive = active === from
      const at = open.indexOf(from)
      doc.transact(() => { files.set(to, text); files.delete(from) })
      if (at >= 0 && !open.includes(to)) open.splice(Math.min(at, open.length), 0, to)
      if (wasActive) openFile(to)
      else { renderTabs(); renderTree() }
      return undefined
    })
    tree.before(form)
    const input = form.querySelector('input')!
    input.focus()
    input.select()
  }
  // A folder rename moves each file under it in one change, which the server and every other
  // client see as renames (edits made meanwhile follow the files).
  const renameFolder = (from: string): void => {
    tree.parentElement?.querySelector('.file-form')?.remove()
    const name = from.replace(/\/$/, '')
    const form = fileForm(`Rename folder ${name} to`, name, (to) => {
      const r = folderMoves(files.keys(), from, to)
      if (!r.ok) return r.reason
      doc.transact(() => {
        for (const [a, b] of r.moves) {
          const old = files.get(a)
          files.set(b, new Y.Text(old instanceof Y.Text ? old.toString() : ''))
          files.delete(a)
        }
      })
      renderTabs()
      renderTree()
      return undefined
    })
    tree.before(form)
    const input = form.querySelector('input')!
    input.focus()
    input.select()
  }
  let deleteArmed: string | null = null
  const remove = (path: string, button: HTMLButtonElement): void => {
    if (deleteArmed !== path) {
      deleteArmed = path
      button.textContent = 'Delete?'
      setTimeout(() => { if (!disposed && deleteArmed === path) { deleteArmed = null; renderTree() } }, 4000)
      return
    }
    deleteArmed = null
    files.delete(path)
  }
  const renderNode = (n: TreeNode): HTMLElement => {
    if (n.dir) {
      const name = n.path.replace(/\/$/, '')
      return h('li', { role: 'treeitem', 'aria-expanded': 'true' },
        h('span', { class: 'dir' }, n.name, '/'),
        caps.includes('edit') && !ended ? h('button', { type: 'button', class: 'icon', 'aria-label': `Rename folder ${name}`, title: 'Rename folder', onclick: () => renameFolder(n.path) }, '✎') : null,
        h('ul', { role: 'group' }, n.children.map(renderNode)))
    }
    const editable = caps.includes('edit') && !ended
    const del = h('button', { type: 'button', class: 'icon', 'aria-label': `Delete ${n.path}`, title: 'Delete' }, '✕')
    del.addEventListener('click', () => remove(n.path, del))
    return h('li', { role: 'treeitem', class: n.path === active ? 'active' : '' },
      h('button', { type: 'button', class: 'file', onclick: () => pick(n.path), 'data-path': n.path }, n.name),
      hereIn(n.path),
      h('button', { type: 'button', class: 'icon', 'aria-label': `Download ${n.path}`, title: 'Download', 'data-testid': `download-${n.path}`, onclick: () => download(n.path) }, '⤓'),
      editable ? h('button', { type: 'button', class: 'icon', 'aria-label': `Rename ${n.path}`, title: 'Rename', onclick: () => rename(n.path) }, '✎') : null,
      editable ? del : null)
  }
  const renderTree = (): void => {
    peerFiles = whoIsWhere()
    const nodes = buildTree(files.keys())
    // A tree holds tree items only: with none, it is hidden and a hint says so.
    replace(tree, nodes.map(renderNode))
    tree.hidden = nodes.length === 0
    treeEmpty.hidden = nodes.length > 0
    replace(treeTools, caps.includes('edit') && !ended
      ? [action('New file', newFile, { 'data-testid': 'new-file', title: 'New file (Alt+N)' }),
          action('Upload…', () => uploadInput.click(), { 'data-testid': 'upload', title: 'Add text files from this computer' })]
      : null)
  }
  const renderTrash = (): void => {
    if (!trashBox.open || disposed) return
    api.trash(id).then((items) => {
      if (disposed) return
      const may = caps.includes('edit') && !ended
      replace(trashList, items.length
        ? items.map((t) => h('li', null,
          h('span', { class: 'trash-path', title: t.path }, t.path),
          h('span', { class: 'hint' }, ` deleted by ${t.deleted_by_name}, ${new Date(t.deleted_at).toLocaleString()}`),
          may
            ? h('button', {
                type: 'button',
                class: 'small',
                'aria-label': `Restore ${t.path}`,
                onclick: () => {
                  api.restoreTrashed(id, t.id)
                    .then((r) => { toast(`${r.path} is back.`); renderTrash() })
                    .catch((err: unknown) => { toast(errorText(err), 'error'); renderTrash() })
                },
              }, 'Restore')
            : null))
        : h('li', { class: 'hint' }, 'Nothing deleted lately.'))
    }).catch((err: unknown) => replace(trashList, h('li', { class: 'hint' }, errorText(err))))
  }
  let trashTimer: ReturnType<typeof setTimeout> | undefined
  /** Soon, once the journal has kept what was just deleted. */
  const renderTrashSoon = (): void => {
    clearTimeout(trashTimer)
    trashTimer = setTimeout(renderTrash, 500)
  }
  disposers.push(() => clearTimeout(trashTimer))
  trashBox.addEventListener('toggle', renderTrash)
  /** Who deleted `path` (the newest such file in the room's trash), when the trash says. */
  const deletedBy = async (path: string): Promise<{ id: string, name: string } | null> => {
    for (let i = 0; i < 20 && !disposed; i++) {
      const t = await api.trash(id).catch(() => [])
      const found = t.find((x) => x.path === path && Date.now() - x.deleted_at < 120_000)
      if (found) return { id: found.id, name: found.deleted_by_name }
      await new Promise((resolve) => setTimeout(resolve, 250))
    }
    return null
  }
  /** The open file left the document by someone else's change: the editor keeps what is
   *  shown and typed (focus and cursor too) until the room has answered for everything sent
   *  before, then binds it to what the file became: its new path, or the same path when the
   *  room brought it back (typing its deleter had not seen) or it was replaced. A deleted file
   *  someone typed into since comes back as theirs; otherwise the tab closes and a notice says
   *  who deleted it, with a way to restore it. */
  /** The open editor bound to `text`, the file now at `path` (see `Editor.rebind`). */
  const rebindTo = (path: string, text: Y.Text): void => {
    editor.rebind(path, text)
    editor.setEditable(caps.includes('edit') && !ended)
    provider.awareness.setLocalStateField('file', path)
  }
  let settling = 0
  const settle = (from: string, to: string | null): void => {
    editor.detach()
    const mine = ++settling
    void roundTrip().then(async () => {
      if (disposed || mine !== settling || active !== (to ?? from)) return
      const where = to ?? from
      const text = files.get(where)
      if (text instanceof Y.Text) {
        rebindTo(where, text)
        if (to === null) {
          const by = await deletedBy(from)
          notice(`${by?.name ?? 'Someone'} deleted ${from} while you were in it; it is back, with everything typed in it.`, 'file-came-back')
        }
        renderTabs()
        renderTree()
        return
      }
      const by = deletedBy(from)
      const typing = editor.detachedTyping()
      if (typing?.typed && caps.includes('edit') && !ended) {
        bringBack(from, by)
        return
      }
      // Still shown, marked deleted: typing in it brings it back.
      orphan = from
      editor.onDetachedEdit = () => {
        if (orphan !== from || !caps.includes('edit') || ended) return
        setTimeout(() => { if (orphan === from && !disposed) bringBack(from, by) }, 0)
      }
      renderTabs()
      renderTree()
      noticeDeleted(from, await by)
    })
  }
  /** The open file someone else deleted, still shown (unbound) in the editor: typing in it
   *  brings it back as this person's. */
  let orphan: string | null = null
  /** Makes what the editor shows of deleted file `path` a file again (this person's change),
   *  under its path or beside a file that took it, and says who had deleted it. */
  const bringBack = (path: string, by: Promise<{ id: string, name: string } | null>): void => {
    const typing = editor.detachedTyping()
    if (!typing) return
    orphan = null
    const at = freePath(path, (p) => files.has(p))
    // What it held; the typing since goes in as the editor is bound to it.
    const back = new Y.Text(typing.base)
    const i = open.indexOf(path)
    if (i >= 0) open.splice(i, 1, at)
    else open.push(at)
    active = at
    files.set(at, back)
    rebindTo(at, back)
    renderTabs()
    renderTree()
    void by.then((who) => notice(`${who?.name ?? 'Someone'} deleted ${path} while you were typing in it; it is back${at === path ? '' : ` as ${at}`}, with what you typed.`, 'file-came-back'))
  }
  const noticeDeleted = (path: string, by: { id: string, name: string } | null): void => {
    const restore = by && caps.includes('edit') && !ended
      ? {
          label: 'Restore',
          run: async () => {
            const r = await api.restoreTrashed(id, by.id)
            const opened = (): boolean => { if (!files.has(r.path)) return false; pick(r.path); return true }
            if (!opened()) {
              const onChange = (): void => { if (opened()) files.unobserve(onChange) }
              files.observe(onChange)
            }
            renderTrash()
          },
        }
      : undefined
    notice(`${by?.name ?? 'Someone'} deleted ${path}.${restore ? ' It waits in the trash.' : ''}`, 'file-deleted', restore)
  }
  files.observe((e) => {
    // A rename (here or by anyone) deletes a path and adds the one it became in one change: an
    // open tab follows it.
    const added = [...e.changes.keys].filter(([k, c]) => c.action === 'add' && files.has(k)).map(([k]) => k)
    const local = e.transaction.local
    for (const [key, change] of e.changes.keys) {
      if (change.action === 'delete' && !files.has(key)) {
        const to = movedTo(key, added)
        const i = open.indexOf(key)
        if (i >= 0) {
          if (to !== null && !open.includes(to)) open.splice(i, 1, to)
          else if (to !== null || local || active !== key) open.splice(i, 1)
        }
        if (active === key && !local) {
          // Someone else's change: the editor holds on (see `settle`).
          active = to ?? key
          settle(key, to)
        } else {
          editor.forget(key)
          if (active === key) {
            active = null
            if (to !== null) openFile(to)
            else if (open.length) openFile(open[open.length - 1])
          }
          if (!local && i >= 0 && to === null) void deletedBy(key).then((by) => noticeDeleted(key, by))
        }
      } else if (change.action === 'add' && key === orphan && active === key) {
        // Brought back (restored from the trash): the editor shows it again, bound.
        const text = files.get(key)
        if (text instanceof Y.Text) {
          orphan = null
          rebindTo(key, text)
        }
      } else if (change.action === 'update' && active === key) {
        // Replaced (a reset by another client): the editor follows to the new text, keeping
        // what is typed meanwhile.
        if (local) openFile(key)
        else settle(key, key)
      }
    }
    if (added.length || [...e.changes.keys.values()].some((c) => c.action === 'delete')) renderTrashSoon()
    renderTabs()
    renderTree()
  })
  renderTabs()
  renderTree()

  // Run: the room's run command (coderoom.toml's, or guessed from the files) typed into the
  // shared terminal by Run or Ctrl/Cmd+Enter; Stop sends Ctrl-C. Both need `type`, like typing
  // (the server checks them as keys); setting the command writes coderoom.toml (`edit`).
  const runButton = h('button', { type: 'button', class: 'small primary', 'data-testid': 'run', onclick: () => runNow() }, 'Run')
  const stopButton = h('button', { type: 'button', class: 'small', 'data-testid': 'run-stop', title: 'Stop what runs (Ctrl-C)', onclick: () => { terminal.interrupt() } }, 'Stop')
  const runLabel = h('code', { class: 'run-command', 'data-testid': 'run-command' })
  const runEdit = h('button', { type: 'button', class: 'small', 'data-testid': 'run-edit', title: `Set the run command (saved in ${MANIFEST})`, onclick: () => editRun() }, 'Edit')
  const runBar = h('span', { class: 'run-bar row' }, runButton, stopButton, runLabel, runEdit, maxButton)
  const currentRun = (): RunCommand | null => runCommand([...files.keys()], (p) => {
    const t = files.get(p)
    return t instanceof Y.Text ? t.toString() : undefined
  })
  const renderRun = (): void => {
    const can = abilities(caps)
    const cmd = currentRun()
    const typeable = can.type && !ended
    runButton.disabled = !typeable || cmd === null
    stopButton.disabled = !typeable
    runButton.title = !typeable ? 'Running needs the right to type' : cmd ? `Run ${cmd.command} (${MAC ? 'Cmd' : 'Ctrl'}+Enter)` : 'No run command yet: set one with Edit'
    runLabel.textContent = cmd ? cmd.command : 'no run command'
    runLabel.title = cmd ? (cmd.from === MANIFEST ? `from ${MANIFEST}` : cmd.from) : ''
    runEdit.hidden = !can.edit || ended
  }
  let runPending = false
  /** Files change with every keystroke: the bar is redrawn once per burst of them. */
  const renderRunSoon = (): void => {
    if (runPending) return
    runPending = true
    queueMicrotask(() => { runPending = false; if (!disposed) renderRun() })
  }
  files.observeDeep(renderRunSoon)
  /** When the document last changed (anyone's edit). */
  let lastDocChange = 0
  doc.on('update', () => { lastDocChange = Date.now() })
  let runWaiting = false
  const runNow = (): void => {
    if (!abilities(caps).type || ended) { toast('Running needs the right to type in this room.'); return }
    if (!currentRun()) { toast('No run command yet: set one with Edit, next to Run.'); return }
    if (conn.pending > 0) { toast('Your latest edits are not saved yet: Run once they are.', 'error'); return }
    if (runWaiting) return
    // The sandbox writes document edits to its disk 150 ms after the last one: a program run
    // at once after an edit would run the file as it was. Run waits until the document has been
    // quiet a little longer than that.
    runWaiting = true
    const wait = (): void => {
      const left = lastDocChange + RUN_QUIET_MS - Date.now()
      if (left > 0) { setTimeout(wait, left); return }
      runWaiting = false
      const cmd = currentRun()
      if (disposed || ended || !cmd) return
      terminal.runLine(cmd.command)
    }
    wait()
  }
  const editRun = (): void => {
    runBar.parentElement?.querySelector('.run-form')?.remove()
    const form = lineForm({
      label: 'Run command', initial: currentRun()?.command ?? '', placeholder: 'python3 main.py', testid: 'run-input',
      class: 'run-form row', submit: 'Save',
      parse: (raw) => { const why = checkCommand(raw); return why ? { ok: false, reason: why } : { ok: true, value: raw.trim() } },
      done: (command) => {
        const t = files.get(MANIFEST)
        const after = withManifestCommand(t instanceof Y.Text ? t.toString() : '', command)
        doc.transact(() => {
          if (t instanceof Y.Text) { t.delete(0, t.length); t.insert(0, after) } else files.set(MANIFEST, new Y.Text(after))
        })
        return undefined
      },
    })
    runBar.after(form)
    form.querySelector('input')?.focus()
  }

  // Terminal.
  const terminal = new SharedTerminal(termEl, id, {
    toolbar: runBar,
    ended: (message) => end(message),
    isShortcut: (e) => shortcut(e, true) !== null,
    selfId: me.id,
    name: (p) => room?.agents?.find((a) => a.agent_id === p.user_id)?.name ?? room?.participants.find((x) => x.user_id === p.user_id)?.email ?? p.email,
    event: (e) => {
      if (e.type === 'capabilities') {
        capsEpoch++
        setCaps(e.capabilities as Capability[], { by: e.by ?? null })
        // The people panel shows this person's role too.
        void reload()
      }
      else if (e.type === 'typing') {
        const shown = (typing.get(e.user_id) ?? 0) > Date.now() - 2500
        typing.set(e.user_id, Date.now())
        if (!shown && panel === 'People') renderSide()
        // The indicator goes 2.6 s after the last event (one arrives each second of typing).
        clearTimeout(typingTimers.get(e.user_id))
        typingTimers.set(e.user_id, setTimeout(() => { if (!disposed && panel === 'People') renderSide() }, 2600))
      }
      else if (e.type === 'sandbox' && ['preparing', 'ready', 'not_ready'].includes(e.state ?? '')) {
        // The readiness step moved on: the panels that show it say so at once.
        void reload().then(() => { if (panel === 'Sandbox' || panel === 'Checkpoints') renderSide() })
      } else if (e.type === 'spent') {
        // A budget was reached: whoever is here is told what stopped, once.
        toast(e.reason, 'error')
        if (panel === 'Spend') renderSide()
      } else if (e.type === 'restored') {
        // A restore replaced everyone's files: everyone is told who did it, and whoever may
        // restore can undo it in one click (the room as it was just before is a checkpoint).
        const who = e.by === me.email ? 'You' : e.by
        const can = abilities(caps)
        const undo = can.edit && can.type
          ? {
              label: 'Undo',
              run: async () => {
                const r = await api.restore(id, e.undo)
                if (r.state === 'pending_approval') toast('Undoing it needs someone else\'s approval: asked (Approvals panel).')
              },
            }
          : undefined
        notice(`${who} restored the checkpoint "${e.checkpoint}": every file is as it was then. What was here just before is kept as a checkpoint.`, 'restored', undo)
        if (panel === 'Checkpoints') renderSide()
      } else if (e.type === 'budget') {
        void reload().then(() => { if (panel === 'Spend') renderSide() })
      } else if (e.type === 'people_changed' || e.type === 'sandbox') void reload()
      else if (e.type === 'read_only') setCaps(caps.filter((c) => c !== 'type'), undefined, true)
    },
  })
  disposers.push(() => terminal.destroy())
  disposers.push(() => { for (const t of typingTimers.values()) clearTimeout(t) })

  // Presence: who is online (the server stamps each state with its connection's user).
  const updateOnline = (): void => {
    // This person is here while the document's socket is: alone or not.
    const now = new Set<string>(provider.wsconnected ? [me.id] : [])
    for (const [client, state] of provider.awareness.getStates()) {
      if (client === provider.awareness.clientID) continue
      const uid = (state as { user?: { id?: unknown } }).user?.id
      if (typeof uid === 'string') now.add(uid)
    }
    // Cursor moves change presence constantly; only a change in who is here redraws.
    if (now.size === online.size && [...now].every((u) => online.has(u))) return
    online.clear()
    for (const u of now) online.add(u)
    if (panel === 'People') renderSide()
  }
  // Avatars of the others here, in their colours; clicking one follows them (their file, their
  // cursor) until this person types or presses Esc.
  const avatars = h('span', { class: 'avatars', role: 'group', 'aria-label': 'People here' })
  const followNote = h('span', { class: 'following', 'data-testid': 'following', role: 'status', hidden: true })
  title?.append(avatars, followNote)
  let following: string | null = null
  const renderAvatars = (list = here()): void => {
    replace(avatars, list.map((p) => h('button', {
      type: 'button', class: 'avatar', style: `background:${p.color};color:${inkOn(p.color)}`, 'data-testid': `avatar-${p.name}`,
      'aria-pressed': String(following === p.id),
      // Begins with what it shows (the initials), as a name must for those who speak it.
      'aria-label': `${initials(p.name)}: ${following === p.id ? `stop following ${p.name}` : `follow ${p.name}${p.file ? ` (in ${p.file})` : ''}`}`,
      title: following === p.id ? `Following ${p.name}: click or press Esc to stop` : `${p.name}${p.file ? ` · ${p.file}` : ''}: click to follow`,
      onclick: () => { if (following === p.id) stopFollowing(); else follow(p.id) },
    }, initials(p.name))))
    const f = list.find((p) => p.id === following)
    followNote.hidden = !f
    followNote.textContent = f ? `Following ${f.name} · Esc to stop` : ''
  }
  const followNow = (list = here()): void => {
    const p = list.find((x) => x.id === following)
    if (!p?.file) return
    if (p.file !== active) pick(p.file)
    if (!p.head) return
    try {
      const pos = Y.createAbsolutePositionFromRelativePosition(Y.createRelativePositionFromJSON(p.head), doc)
      if (pos && pos.type === files.get(p.file)) editor.reveal(pos.index)
    } catch { /* a cursor this page cannot place yet */ }
  }
  const follow = (id: string): void => { following = id; renderAvatars(); followNow() }
  const stopFollowing = (): void => { following = null; renderAvatars() }
  let whereShown = ''
  provider.awareness.on('change', () => {
    const list = here()
    // Avatars, tabs and tree show who is here and which file each has open: redrawn when that
    // changes, not at every cursor move.
    const now = list.map((p) => `${p.id}:${p.name}:${p.color}:${p.file ?? ''}`).join()
    if (now !== whereShown) { whereShown = now; renderAvatars(list); renderTabs(); renderTree() }
    if (following) followNow(list)
  })
  // Esc, or any key that types (in the editor, the terminal, anywhere), ends following.
  const onKey = (e: KeyboardEvent): void => {
    if (!following) return
    const types = e.key.length === 1 && !e.ctrlKey && !e.metaKey && !e.altKey
    if (e.key === 'Escape' || types) stopFollowing()
  }
  document.addEventListener('keydown', onKey)
  disposers.push(() => document.removeEventListener('keydown', onKey))
  // Others' names over their carets show for a few seconds after each edit of theirs (not
  // only on hover), so who is typing where can be read at a glance.
  let namesTimer: ReturnType<typeof setTimeout> | undefined
  doc.on('update', (_u: Uint8Array, origin: unknown) => {
    if (origin !== provider || disposed) return
    editorEl.classList.add('names-shown')
    clearTimeout(namesTimer)
    namesTimer = setTimeout(() => editorEl.classList.remove('names-shown'), NAMES_SHOWN_MS)
  })
  disposers.push(() => clearTimeout(namesTimer))
  // Typing in the editor ends following (the keys are this person's own work now).
  doc.on('update', (_u: Uint8Array, origin: unknown) => { if (origin !== provider && following) stopFollowing() })
  provider.awareness.on('change', updateOnline)
  provider.on('status', updateOnline)
  updateOnline()

  // Side panels.
  // The last panel looked at in each group: choosing a group goes back to it.
  const lastIn = new Map<string, Panel>()
  const renderNav = (): void => {
    const group = groupOf(panel)
    lastIn.set(group, panel)
    // What waits for this person's decision: counted on the Approvals tab, or on its group's
    // button while another group is shown.
    const count = (): HTMLElement | null => waiting > 0
      ? h('span', { class: 'badge count', 'data-testid': 'approvals-count', 'aria-label': `, ${waiting} waiting for your decision` }, String(waiting))
      : null
    replace(sideGroups, GROUPS.map(([g, ps]) => h('button', {
      type: 'button', class: `small${g === group ? ' active' : ''}`, 'aria-pressed': g === group ? 'true' : 'false',
      'data-group-panels': ps.join(' '), 'data-testid': `panel-group-${g}`,
      onclick: () => { panel = lastIn.get(g) ?? ps[0]; renderNav(); renderSide() },
    }, g, g !== group && ps.includes('Approvals') ? count() : null)))
    const shown = GROUPS.find(([g]) => g === group)?.[1] ?? []
    replace(sideNav, shown.map((p) => {
      const i = PANELS.indexOf(p)
      return h('button', {
        type: 'button', role: 'tab', class: p === panel ? 'active' : '', 'aria-selected': p === panel ? 'true' : 'false',
        title: i < 10 ? `${p} (Alt+${(i + 1) % 10})` : p, onclick: () => { panel = p; renderNav(); renderSide() },
      }, p, p === 'Approvals' ? count() : null)
    }))
  }
  // Each panel keeps its own scroll position.
  const scrolls = new Map<Panel, number>()
  sideBody.addEventListener('scroll', () => { scrolls.set(panel, sideBody.scrollTop) })
  const restoreScroll = (): void => { sideBody.scrollTop = scrolls.get(panel) ?? 0 }
  let sideSeq = 0
  // Which panel sideBody shows: what is typed in it is carried through its redraws.
  let drawn: Panel | null = null
  watchEdits(sideBody)
  const redraw = (shown: Panel, draw: () => void): void => {
    const kept = drawn === shown ? keep(sideBody) : null
    draw()
    drawn = shown
    if (kept) putBack(sideBody, kept)
  }
  const renderSide = (): void => {
    if (!room || disposed) return
    const r = room
    const seq = ++sideSeq
    const shown = panel
    const refresh = (): void => { void reload().then(() => { if (seq === sideSeq) renderSide() }) }
    // Panels that fetch draw into a box shown only if it is still the panel asked for.
    const later = (draw: (box: HTMLElement) => Promise<void>): void => {
      const box = h('div')
      draw(box)
        .then(() => { if (seq === sideSeq && !disposed) { redraw(shown, () => replace(sideBody, box)); restoreScroll() } })
        .catch((e: unknown) => { if (seq === sideSeq && !disposed) replace(sideBody, h('p', { class: 'error' }, errorText(e))) })
    }
    switch (panel) {
      case 'People': redraw(shown, () => peoplePanel(sideBody, { room: r, selfId: me.id, online, typing, armed: armedRemovals, detailed: detailedRights }, reload)); break
      case 'Approvals': later((box) => approvalsPanel(box, r, me.id, refresh)); break
      case 'Sandbox': later((box) => sandboxPanel(box, r, refresh)); break
      case 'Checkpoints': later((box) => checkpointsPanel(box, r, me.id, app.go, refresh)); break
      case 'Secrets': later((box) => secretsPanel(box, r, me.id, refresh)); break
      case 'Network': later((box) => networkPanel(box, r, me.id, refresh)); break
      case 'Repos': later((box) => reposPanel(box, r, me.id, refresh)); break
      case 'Audit': later((box) => auditPanel(box, r, refresh)); break
      case 'Room': redraw(shown, () => roomPanel(sideBody, r, () => Array.from(files.keys()).sort())); break
      case 'Previews': later((box) => previewsPanel(box, r, me.id, pane, refresh)); break
      case 'Spend': later((box) => spendPanel(box, r, me.id, refresh)); break
    }
    restoreScroll()
  }

  // Rights: from the terminal's `capabilities` events, and from polling the room.
  // The rights last told by the server (the read-only hint that comes before a push is not).
  let toldCaps: Capability[] = []
  // A change a poll found waits a moment for the terminal's push, which names who made it.
  let deferred: { from: Capability[], timer: ReturnType<typeof setTimeout> } | null = null
  disposers.push(() => { if (deferred) clearTimeout(deferred.timer) })
  const tell = (before: Capability[], next: Capability[], told: { by: string | null, poll?: boolean }): void => {
    const from = deferred?.from ?? before
    if (deferred) clearTimeout(deferred.timer)
    deferred = null
    const said = rightsNotice(from, next, told.by)
    if (!said || ended) return
    if (told.poll) deferred = { from, timer: setTimeout(() => { deferred = null; notice(said, 'rights-notice') }, 1500) }
    else notice(said, 'rights-notice')
  }
  const setCaps = (next: Capability[], told?: { by: string | null, poll?: boolean }, hint = false): void => {
    const changed = next.join() !== caps.join()
    // A change told by a push or a poll (not the first rights this page learns): say so.
    if (told && (next.join() !== toldCaps.join() || deferred)) tell(toldCaps, next, told)
    if (!hint) toldCaps = next
    const lostEdit = caps.includes('edit') && !next.includes('edit')
    const regained = !caps.includes('edit') && next.includes('edit')
    caps = next
    if (regained && !ended) banner.hidden = true
    if (lostEdit) {
      layout.querySelector('.file-form')?.remove()
      // Edits sent just before the change (or waiting offline) were refused by the server:
      // this copy may now differ from everyone else's.
      if (conn.pending > 0 || Date.now() - lastLocalEdit < 5000) {
        replace(banner, h('strong', null, 'You can no longer edit this room; your latest edits may not have been kept. '),
          action('Reload the room', () => app.go(location.pathname)))
        banner.hidden = false
      }
    }
    const can = abilities(caps)
    editor.setEditable(can.edit && !ended)
    terminal.setCanType(can.type && !ended)
    renderRun()
    layout.classList.toggle('viewer', !can.edit)
    if (room) room.my_capabilities = caps
    if (changed) { renderTree(); renderSide() }
  }
  // What the People panel shows: a change in anything else (sandbox timers) must not redraw it.
  const shown = (r: Room | null): string => r ? JSON.stringify([r.name, r.participants, r.agents, r.my_capabilities]) : ''
  const reload = async (): Promise<void> => {
    if (ended || disposed) return
    const epoch = capsEpoch
    // Decisions and requests are looked for beside the room, not after it: the room's view
    // waits while its sandbox starts or stops (its state is part of it), and a notice must not.
    // The first look waits for the room, for the names it shows.
    if (room !== null) void watchApprovals()
    try {
      const next = await readRoster()
      if (disposed || ended) return
      if (lostAccess) { clearTimeout(lostAccess); lostAccess = null }
      // The terminal pushed newer rights while this answer was on its way: they win.
      if (epoch !== capsEpoch) next.my_capabilities = caps
      const changed = shown(next) !== shown(room)
      const first = room === null
      room = next
      if (title && !title.querySelector('.name')) title.prepend(h('span', { class: 'name' }, room.name))
      setCaps(room.my_capabilities, first ? undefined : { by: null, poll: true })
      showDeletion(room)
      if (first) void watchApprovals()
      // Panels with their own Refresh are left alone (a poll must not wipe what someone reads).
      if (first || (changed && panel === 'People')) renderSide()
    } catch (e) {
      if (disposed) return
      if (e instanceof ApiError && e.status === 404) {
        if (!room) end('This room does not exist, or you are not in it.')
        // The sockets' close codes say why (removed, deleted); give them a moment to arrive.
        else if (!lostAccess) lostAccess = setTimeout(() => end('You no longer have access to this room.'), 2000)
      } else if (!room) {
        end(`The room cannot be loaded: ${errorText(e)}`)
      }
    }
  }
  // Who is in the room, from the room's newest reading (the poll's, or the approvals watch's
  // own): the names notices give and the sponsors `mayDecide` asks about.
  let roster: Room | null = null
  let rosterAsked = 0
  let rosterFrom = 0
  const readRoster = async (): Promise<Room> => {
    const asked = ++rosterAsked
    const next = await api.room(id)
    if (asked > rosterFrom) { roster = next; rosterFrom = asked }
    return next
  }
  // Requests this person made that wait for someone else: told once each is decided (also one
  // asked and decided between two looks: it was not there at the last look). Requests this
  // person may decide: counted on the Approvals tab, and told as they are asked.
  let seen: Map<string, string> | null = null
  let waiting = 0
  let looks = 0
  const watchApprovals = async (): Promise<void> => {
    const look = ++looks
    try {
      const r = await api.approvals(id)
      const list = Array.isArray(r) ? r : r.approvals
      // What this look would tell: a decision of this person's request, or a request new since
      // the last look that this person may decide.
      const told = list.filter((a) => {
        const before = seen?.get(a.id)
        if (a.requester === me.id) return seen !== null && a.state !== 'pending' && (before === undefined || before === 'pending')
        return a.state === 'pending' && before === undefined && abilities(caps).approve
      })
      // Someone the room did not hold at its last reading (an agent made a moment ago, asking
      // at once) is looked up first: told by name, and its sponsor not asked to decide it.
      const known = (who: string | null | undefined): boolean => !who ||
        (roster?.participants ?? []).some((p) => p.user_id === who) || (roster?.agents ?? []).some((g) => g.agent_id === who)
      if (told.some((a) => !known(a.requester === me.id ? a.decided_by : a.requester))) await readRoster()
      // A newer look (or the page's end) came while this one waited: that one tells.
      if (look !== looks || disposed || ended) return
      const people = roster?.participants ?? []
      const agents = roster?.agents ?? []
      let decided = false
      if (seen !== null) {
        for (const a of list) {
          const before = seen.get(a.id)
          if (before !== undefined && before !== 'pending') continue
          if (a.requester === me.id) {
            const by = a.decided_by ? whoIs(a.decided_by, people, agents) : null
            const said = decisionNotice(a.action, a.state, by)
            if (said) notice(said, `decision-${a.id}`)
          } else if (before === undefined && a.state === 'pending' && mayDecide(a, agents)) {
            notice(askedNotice(whoIs(a.requester, people, agents), a.action, a.params), `asked-${a.id}`)
          }
          if (a.state !== 'pending') decided = true
        }
      }
      const decidable = list.filter((a) => a.state === 'pending' && mayDecide(a, agents))
      if (seen === null && decidable.length > 0) {
        // Arriving while requests wait for this person: told too, once.
        const [a] = decidable
        notice(decidable.length === 1
          ? askedNotice(whoIs(a.requester, people, agents), a.action, a.params)
          : `${decidable.length} requests wait for your decision. Decide in the Approvals panel.`, `asked-${a.id}`)
      }
      seen = new Map(list.map((a) => [a.id, a.state]))
      const now = decidable.length
      if (now !== waiting) { waiting = now; renderNav() }
      // A panel showing something that waited shows its decision (and what it now lets one
      // do) without a Refresh.
      if (decided && (['Approvals', 'Previews', 'Network', 'Checkpoints', 'Secrets', 'Spend', 'Repos'] as Panel[]).includes(panel)) renderSide()
    } catch { /* the next poll tries again */ }
  }
  // Whether this person may decide `a`: not their own, nor their own agent's (`agents`: the
  // room's, from its newest reading), and only with `approve`.
  const mayDecide = (a: Approval, agents: Room['agents']): boolean => {
    if (a.requester === me.id || !abilities(caps).approve) return false
    return agents?.find((g) => g.agent_id === a.requester)?.sponsor !== me.id
  }
  // A deletion asked for: everyone here is told, until it is confirmed (the room then ends).
  const showDeletion = (r: Room): void => {
    const d = r.pending_deletion
    deletionNotice.hidden = !d
    if (!d) return
    const who = d.requested_by === me.id ? 'You' : (d.requested_by_email ?? 'The owner')
    deletionNotice.textContent = d.state === 'pending_confirmation'
      ? `${who} asked to delete this room. A system admin must confirm it; until then everything here works. Copy out what you want to keep.`
      : 'This room is being deleted.'
  }
  const poll = setInterval(() => { void reload() }, POLL_MS)
  disposers.push(() => clearInterval(poll))

  let lostAccess: ReturnType<typeof setTimeout> | null = null
  disposers.push(() => { if (lostAccess) clearTimeout(lostAccess) })
  function end (message: string): void {
    if (ended) return
    ended = true
    for (const stop of onEnd) stop()
    if (lostAccess) clearTimeout(lostAccess)
    conn.end(message)
    showConn()
    editor.setEditable(false)
    terminal.stop(message)
    provider.disconnect()
    replace(banner, h('strong', null, message), ' ',
      h('a', { href: '/', onclick: (e: Event) => { e.preventDefault(); app.go('/') } }, 'Back to your rooms'))
    banner.hidden = false
    layout.classList.add('is-ended')
    renderTree()
    renderRun()
  }

  // Keyboard.
  const keys = (e: KeyboardEvent): void => {
    const run = shortcut(e)
    if (!run) return
    e.preventDefault()
    if (e.type === 'keydown') run()
  }
  /** The page's shortcut for a key, if it is one. `inTerminal`: only those that leave the
   *  terminal (Alt+E, Alt+0-9); the shell keeps every other key, Ctrl+S and Alt+N/T included. */
  function shortcut (e: KeyboardEvent, inTerminal = false): (() => void) | null {
    // Alt+letter, by the character it gives: where Alt (macOS Option) types a character of
    // its own (é, #, [) it stays a character. On macOS, Ctrl+Option gives the shortcuts (there
    // Ctrl+Alt is not AltGr).
    if (e.altKey && !e.metaKey && (MAC || !e.ctrlKey)) {
      const k = /^[a-z0-9]$/i.test(e.key) ? e.key.toLowerCase() : ''
      if (k === 'e') return () => editor.focus()
      if (/^[0-9]$/.test(k)) return () => { panel = PANELS[(Number(k) + 9) % 10]; renderNav(); renderSide() }
      if (inTerminal) return null
      if (k === 'n') return newFile
      if (k === 't') return () => terminal.focus()
    }
    if (inTerminal) return null
    if ((e.ctrlKey || e.metaKey) && !e.altKey && e.code === 'KeyS') {
      return () => {
        const v = conn.view()
        toast(!caps.includes('edit')
          ? 'You cannot edit this room.'
          : v.kind === 'ok' ? 'Saved: every edit is stored as you type.' : `Not saved yet: ${v.label}.`)
      }
    }
    return null
  }
  window.addEventListener('keydown', keys)
  disposers.push(() => window.removeEventListener('keydown', keys))
  // Run: Ctrl/Cmd+Enter from anywhere, taken before the editor or the terminal sees it (the
  // editor's own Mod+Enter would insert a line, the shell would get an Enter).
  const runKey = (e: KeyboardEvent): void => {
    if (!(MAC ? e.metaKey : e.ctrlKey) || e.altKey || e.shiftKey || e.key !== 'Enter') return
    e.preventDefault()
    e.stopPropagation()
    runNow()
  }
  window.addEventListener('keydown', runKey, true)
  disposers.push(() => window.removeEventListener('keydown', runKey, true))

  // Quick open (Ctrl/Cmd+P): a file by a few letters of its path; search (Ctrl/Cmd+Shift+F):
  // every line of every file with some text. One palette for both.
  interface Choice { label: string, choose: () => void }
  let palette: HTMLElement | null = null
  const closePalette = (): void => { palette?.remove(); palette = null }
  const openPalette = (o: { label: string, placeholder: string, testid: string, empty: string, find: (q: string) => Choice[] }): void => {
    closePalette()
    const input = h('input', {
      type: 'text', role: 'combobox', 'aria-expanded': 'true', 'aria-controls': 'palette-list',
      'aria-label': o.label, placeholder: o.placeholder, 'data-testid': o.testid,
    })
    const listEl = h('ul', { id: 'palette-list', role: 'listbox', class: 'quick-list' })
    let found: Choice[] = []
    let at = 0
    const choose = (c: Choice): void => { closePalette(); c.choose() }
    const draw = (): void => {
      found = o.find(input.value)
      at = Math.min(at, Math.max(0, found.length - 1))
      replace(listEl, found.length
        ? found.map((c, i) => h('li', {
          role: 'option', 'aria-selected': String(i === at), class: i === at ? 'active' : '',
          onmousedown: (e: Event) => { e.preventDefault(); choose(c) },
        }, c.label))
        : h('li', { class: 'hint' }, input.value ? o.empty : o.placeholder))
    }
    input.addEventListener('input', () => { at = 0; draw() })
    input.addEventListener('keydown', (e) => {
      if (e.key === 'ArrowDown' || e.key === 'ArrowUp') {
        e.preventDefault()
        at = (at + (e.key === 'ArrowDown' ? 1 : found.length - 1)) % Math.max(1, found.length)
        draw()
      } else if (e.key === 'Enter') {
        e.preventDefault()
        if (found[at]) choose(found[at])
      } else if (e.key === 'Escape') {
        e.preventDefault()
        closePalette()
      }
    })
    input.addEventListener('blur', () => setTimeout(closePalette, 0))
    palette = h('div', { class: 'quick-open', role: 'dialog', 'aria-label': o.label }, input, listEl)
    document.body.append(palette)
    draw()
    input.focus()
  }
  const openFileAt = (path: string, offset?: number): void => {
    pick(path)
    if (offset !== undefined) editor.reveal(offset)
    editor.focus()
  }
  const texts = (): [string, string][] => {
    const out: [string, string][] = []
    files.forEach((t, p) => { if (t instanceof Y.Text) out.push([p, t.toString()]) })
    return out
  }
  const quickKey = (e: KeyboardEvent): void => {
    if (!(MAC ? e.metaKey : e.ctrlKey) || e.altKey || ended) return
    const open = !e.shiftKey && e.code === 'KeyP'
    const search = e.shiftKey && e.code === 'KeyF'
    if (!open && !search) return
    // Taken before the browser (print, find), the editor and the terminal see it.
    e.preventDefault()
    e.stopPropagation()
    if (open) {
      openPalette({
        label: 'Open a file: type part of its path', placeholder: 'Open a file…', testid: 'quick-open', empty: 'No file matches.',
        find: (q) => quickMatches(files.keys(), q).map((p) => ({ label: p, choose: () => openFileAt(p) })),
      })
    } else {
      openPalette({
        label: 'Search every file', placeholder: 'Search every file…', testid: 'search-files', empty: 'Found nowhere.',
        find: (q) => searchFiles(texts(), q).map((x) => ({ label: `${x.path}:${x.line}  ${x.text.trim()}`, choose: () => openFileAt(x.path, x.offset) })),
      })
    }
  }
  window.addEventListener('keydown', quickKey, true)
  disposers.push(() => { window.removeEventListener('keydown', quickKey, true); closePalette() })

  // Something started listening in the sandbox: offer its preview (and take the offer back
  // when that port closes).
  let offeredPort: number | null = null
  /** What the server offered when this page loaded, and what changed since. */
  const offered: { previews: boolean | null, admin: boolean } = { previews: null, admin: me.is_admin }
  const changed = new Set<string>()
  const configChanged = (what: string): void => {
    if (changed.has(what) || disposed) return
    changed.add(what)
    replace(configNotice,
      h('span', null, `The server restarted with another configuration: ${[...changed].join('; ')}.`),
      action('Reload', async () => { window.location.reload() }, { class: 'primary', 'data-testid': 'config-reload' }))
    configNotice.hidden = false
  }
  const servesPreviews = (on: boolean): void => {
    if (offered.previews === null) offered.previews = on
    else if (offered.previews !== on) configChanged(on ? 'previews are on now' : 'previews are off now')
  }
  // Back after a lost connection (a restart, most likely): is this person still an admin?
  let wasDown = false
  provider.on('status', ({ status }: { status: string }) => { if (status === 'disconnected') wasDown = true })
  provider.on('sync', (synced: boolean) => {
    if (!synced || !wasDown || disposed) return
    wasDown = false
    api.me().then((now) => {
      if (now.is_admin !== offered.admin) configChanged(now.is_admin ? 'you are an admin now' : 'you are no longer an admin')
    }).catch(() => {})
  })
  const ports = new PortWatch(id, (port, live) => {
    const can = abilities(caps)
    if (ended || (!live && !can.publish)) return
    offeredPort = port
    const open = live
      ? action('Open its preview', async () => { portNotice.hidden = true; await pane.show(live) }, { class: 'primary', 'data-testid': 'port-notice-open' })
      : action('Preview it (room only)', async () => {
        const p = await api.createPreview(id, { port, visibility: 'room', ttl_s: 8 * 3600 })
        portNotice.hidden = true
        await pane.show(p)
        if (panel === 'Previews') renderSide()
      }, { class: 'primary', 'data-testid': 'port-notice-open' })
    replace(portNotice, h('span', null, `Port ${port} is open${live ? '' : ': preview it?'}`), open,
      action('Dismiss', () => { portNotice.hidden = true }))
    portNotice.hidden = false
  }, (port) => {
    if (port === offeredPort) { portNotice.hidden = true; offeredPort = null }
  }, servesPreviews)
  ports.start(PORTS_MS)
  disposers.push(() => ports.stop())
  onEnd.push(() => ports.stop())

  renderNav()
  void reload()
  return () => {
    disposed = true
    for (const d of disposers.reverse()) {
      try { d() } catch { /* keep tearing down */ }
    }
    connStatus.remove()
  }
}
