// A few DOM helpers: the client is small enough not to need a framework.

type Child = Node | string | number | null | undefined | false
type Attrs = Record<string, unknown>

export function h<K extends keyof HTMLElementTagNameMap> (tag: K, attrs?: Attrs | null, ...children: (Child | Child[])[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag)
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue
    if (k.startsWith('on')) {
      // Handlers only as functions: never as attribute text (that would be script).
      if (typeof v === 'function') el.addEventListener(k.slice(2).toLowerCase(), v as EventListener)
    } else if (k === 'class') {
      el.className = String(v)
    } else if (k === 'value' && 'value' in el) {
      (el as HTMLInputElement).value = String(v)
    } else if (v === true) {
      el.setAttribute(k, '')
    } else {
      el.setAttribute(k, String(v))
    }
  }
  append(el, children)
  return el
}

function append (el: Element, children: (Child | Child[])[]): void {
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue
    el.append(c instanceof Node ? c : String(c))
  }
}

export function replace (el: Element, ...children: (Child | Child[])[]): void {
  el.replaceChildren()
  append(el, children)
}

/** A short-lived message at the bottom of the screen (also read out by screen readers). */
export function toast (message: string, kind: 'info' | 'error' = 'info'): void {
  const t = h('div', { class: `toast ${kind}` }, message)
  toastBox().append(t)
  setTimeout(() => t.remove(), kind === 'error' ? 8000 : 4000)
}

/** A toast that stays until dismissed (or 20 s), replacing an earlier one of the same kind:
 *  for what someone must not miss, such as their own rights changing. */
export function notice (message: string, testid: string, act?: { label: string, run: () => Promise<void> }): void {
  const box = toastBox()
  box.querySelector(`[data-testid="${testid}"]`)?.remove()
  const close = h('button', { type: 'button', class: 'icon', 'aria-label': 'Dismiss' }, '×')
  // One thing to do about it, one click away (the notice goes once it is done).
  const button = act ? action(act.label, async () => { await act.run(); t.remove() }, { 'data-testid': `${testid}-act` }) : null
  const t = h('div', { class: 'toast notice', 'data-testid': testid }, h('span', null, message), button, close)
  close.addEventListener('click', () => t.remove())
  box.append(t)
  // One with something to do stays a minute.
  setTimeout(() => t.remove(), act ? 60_000 : 20_000)
}

/** Where toasts go (a polite live region, made on first use). */
function toastBox (): HTMLElement {
  let box = document.getElementById('toasts')
  if (!box) {
    box = h('div', { id: 'toasts', role: 'status', 'aria-live': 'polite' })
    document.body.append(box)
  }
  return box
}

/** A button that does something that cannot be undone: the first click turns its text into
 *  `confirming` for 5 s, a second click within them runs `act` (the button disabled while it
 *  runs, enabled again when `act` throws, which `act` reports itself). */
/**
 * A `select` whose choice changes authority: choosing shows, beside it, a button saying in
 * words what will happen (`describe`); only its click does it (`apply`). Choosing nothing (or
 * Cancel) takes the offer back. The button's test id is the select's, plus `-confirm`.
 */
export function confirmChoice (select: HTMLSelectElement, describe: (value: string) => string, apply: (value: string) => Promise<void>): HTMLElement {
  const box = h('span', { class: 'row confirm-choice' }, select)
  let offer: HTMLElement | null = null
  const withdraw = (): void => { offer?.remove(); offer = null }
  select.addEventListener('change', () => {
    withdraw()
    const value = select.value
    if (!value) return
    const id = select.getAttribute('data-testid')
    offer = h('span', { class: 'row' },
      action(describe(value), async () => {
        select.disabled = true
        try {
          await apply(value)
          withdraw()
        } finally {
          select.disabled = false
        }
      }, { class: 'primary small', 'data-testid': id ? `${id}-confirm` : null }),
      action('Cancel', () => { select.value = ''; withdraw() }, { class: 'small' }))
    box.append(offer)
  })
  return box
}

export function confirmButton (label: string, confirming: string, act: () => Promise<void>, attrs: Record<string, unknown> = {}): HTMLButtonElement {
  const b = h('button', { type: 'button', ...attrs }, label)
  let armedUntil = 0
  b.addEventListener('click', async () => {
    if (armedUntil < Date.now()) {
      armedUntil = Date.now() + CONFIRM_MS
      b.textContent = confirming
      setTimeout(() => { b.textContent = label }, CONFIRM_MS)
      return
    }
    armedUntil = 0
    b.disabled = true
    try {
      await act()
    } catch {
      b.disabled = false
    }
  })
  return b
}

/** How long a confirming button waits for its second click. */
const CONFIRM_MS = 5000

export function errorText (e: unknown): string {
  return e instanceof Error ? e.message : String(e)
}

export function when (ms: number | null | undefined): string {
  if (!ms) return '—'
  return new Date(ms).toLocaleString()
}

/** A button that runs `action`, disabled while it runs, reporting failures. */
export function action (label: string, run: () => Promise<void> | void, attrs: Attrs = {}): HTMLButtonElement {
  const b = h('button', { type: 'button', ...attrs }, label)
  b.addEventListener('click', async () => {
    b.disabled = true
    try {
      await run()
    } catch (e) {
      toast(errorText(e), 'error')
    } finally {
      b.disabled = false
    }
  })
  return b
}

/** Copies text, falling back to a selection copy where the clipboard API is unavailable (plain
 *  http on a non-local host). */
export async function copy (text: string, input?: HTMLInputElement): Promise<boolean> {
  try {
    await navigator.clipboard.writeText(text)
    return true
  } catch {
    if (!input) return false
    input.select()
    return document.execCommand('copy')
  }
}
