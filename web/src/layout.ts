// The room's layout as each person left it, remembered in this browser: the terminal's height,
// whether it fills the work area, whether the side panel is hidden; and per room, the open tabs
// and the active one.

/** Where preferences are kept (the browser's localStorage; a map in tests). */
export interface Store { getItem: (k: string) => string | null, setItem: (k: string, v: string) => void }

export interface LayoutPrefs {
  /** The terminal's height in pixels, or `null` for the default share. */
  termPx: number | null
  /** The terminal fills the work area (the editor is hidden). */
  termMax: boolean
  /** The side panel is folded away. */
  sideHidden: boolean
  /** The file tree's width in pixels, or `null` for the default. */
  filesPx: number | null
}

export interface Tabs { open: string[], active: string | null }

/** The terminal and the editor each keep at least this much when the split is dragged. */
export const MIN_PANE_PX = 120
/** The file tree's width keeps within these. */
export const MIN_FILES_PX = 140
export const MAX_FILES_PX = 600
const MAX_TABS = 50

function read (store: Store | null, key: string): unknown {
  try {
    const raw = store?.getItem(key)
    return raw ? JSON.parse(raw) : null
  } catch {
    return null
  }
}

function write (store: Store | null, key: string, value: unknown): void {
  try { store?.setItem(key, JSON.stringify(value)) } catch { /* full or refused: not remembered */ }
}

const layoutKey = (user: string): string => `coderoom:layout:${user}`
const tabsKey = (room: string, user: string): string => `coderoom:tabs:${room}:${user}`

/** What `user` left, or the defaults; anything malformed is ignored. */
export function loadLayout (store: Store | null, user: string): LayoutPrefs {
  const v = read(store, layoutKey(user)) as Partial<LayoutPrefs> | null
  const px = v?.termPx
  return {
    termPx: typeof px === 'number' && Number.isFinite(px) && px >= MIN_PANE_PX ? Math.round(px) : null,
    termMax: v?.termMax === true,
    sideHidden: v?.sideHidden === true,
    filesPx: typeof v?.filesPx === 'number' && Number.isFinite(v.filesPx) ? clampFiles(v.filesPx) : null,
  }
}

/** A file tree width kept within [MIN_FILES_PX, MAX_FILES_PX]. */
export function clampFiles (px: number): number {
  return Math.round(Math.min(MAX_FILES_PX, Math.max(MIN_FILES_PX, px)))
}

export function saveLayout (store: Store | null, user: string, prefs: LayoutPrefs): void {
  write(store, layoutKey(user), prefs)
}

/** The terminal's height for a pointer at `pointerY` in a work area from `top` to `bottom`. */
export function splitAt (pointerY: number, top: number, bottom: number): number {
  return clampTerm(bottom - pointerY, bottom - top)
}

/** `px` kept within what leaves both the editor and the terminal usable in `workPx`. */
export function clampTerm (px: number, workPx: number): number {
  const max = Math.max(MIN_PANE_PX, workPx - MIN_PANE_PX)
  return Math.round(Math.min(max, Math.max(MIN_PANE_PX, px)))
}

export function loadTabs (store: Store | null, room: string, user: string): Tabs {
  const v = read(store, tabsKey(room, user)) as Partial<Tabs> | null
  const open = Array.isArray(v?.open) ? v.open.filter((p): p is string => typeof p === 'string').slice(0, MAX_TABS) : []
  const active = typeof v?.active === 'string' && open.includes(v.active) ? v.active : null
  return { open, active }
}

export function saveTabs (store: Store | null, room: string, user: string, tabs: Tabs): void {
  write(store, tabsKey(room, user), { open: tabs.open.slice(0, MAX_TABS), active: tabs.active })
}

/** The browser's storage, when the page may use it. */
export function browserStore (): Store | null {
  try { return window.localStorage } catch { return null }
}
