// What someone is typing in a side panel survives the panel being drawn again. Panels redraw
// when something they show changes (an approval decided, a budget reached, someone typing in
// the room), and a redraw made new fields: a half-typed budget, invite address or secret name
// was wiped under the typist's fingers. Fields typed in since the last button press in the
// panel carry their value, and the focus and selection, into the field of the same name in
// the redrawn panel. A button press ends the carry (its action read the fields; what it saved
// is what the panel shows next).

type Field = HTMLInputElement | HTMLTextAreaElement | HTMLSelectElement

const FIELDS = 'input, textarea, select'

/** The name a field is found by again in a redrawn panel, if it has one. */
function keyOf (f: Element): string | null {
  const by = f.getAttribute('data-testid') ?? f.getAttribute('name') ?? f.getAttribute('aria-label') ?? f.id
  if (!by) return null
  const type = f.getAttribute('type') ?? ''
  // Radio buttons share a name: each is its own field.
  return `${f.tagName}:${type}:${by}${type === 'radio' ? `:${(f as HTMLInputElement).value}` : ''}`
}

/** Marks fields typed in, and clears the marks when a button is pressed. */
export function watchEdits (root: HTMLElement): void {
  const mark = (e: Event): void => {
    const t = e.target as Element | null
    if (t?.matches?.(FIELDS)) t.setAttribute('data-edited', '')
  }
  root.addEventListener('input', mark)
  root.addEventListener('change', mark)
  root.addEventListener('click', (e) => {
    if ((e.target as Element | null)?.closest?.('button')) {
      for (const f of root.querySelectorAll('[data-edited]')) f.removeAttribute('data-edited')
    }
  }, true)
}

export interface Kept {
  values: Map<string, { value: string, checked: boolean }>
  focus: { key: string, start: number | null, end: number | null, all: boolean } | null
}

/** What was typed in `root`'s fields, and where the focus was. */
export function keep (root: HTMLElement): Kept {
  const values = new Map<string, { value: string, checked: boolean }>()
  for (const f of root.querySelectorAll<Field>('[data-edited]')) {
    const k = keyOf(f)
    if (k) values.set(k, { value: f.value, checked: f instanceof HTMLInputElement && f.checked })
  }
  const active = document.activeElement
  let focus: Kept['focus'] = null
  if (active && root.contains(active) && active.matches(FIELDS)) {
    const k = keyOf(active)
    const text = active instanceof HTMLTextAreaElement || (active instanceof HTMLInputElement && /^(text|search|email|url|password|)$/.test(active.type))
    const start = text ? (active as HTMLInputElement).selectionStart : null
    const end = text ? (active as HTMLInputElement).selectionEnd : null
    // A field selected whole (about to be typed over) stays selected whole in the redrawn
    // panel, even when it holds a value the redraw changed.
    const all = start === 0 && end !== null && end > 0 && end === (active as HTMLInputElement).value.length
    if (k) focus = { key: k, start, end, all }
  }
  return { values, focus }
}

/** Puts back into `root` (freshly drawn) what `keep` took. */
export function putBack (root: HTMLElement, kept: Kept): void {
  if (kept.values.size === 0 && !kept.focus) return
  for (const f of root.querySelectorAll<Field>(FIELDS)) {
    const k = keyOf(f)
    if (!k) continue
    const v = kept.values.get(k)
    if (v) {
      if (f instanceof HTMLInputElement && (f.type === 'checkbox' || f.type === 'radio')) f.checked = v.checked
      else f.value = v.value
      f.setAttribute('data-edited', '')
    }
    if (kept.focus?.key === k && !f.disabled) {
      f.focus({ preventScroll: true })
      if (kept.focus.start !== null && 'setSelectionRange' in f) {
        const len = f.value.length
        const [start, end] = kept.focus.all ? [0, len] : [Math.min(kept.focus.start, len), Math.min(kept.focus.end ?? len, len)]
        try { (f as HTMLInputElement).setSelectionRange(start, end) } catch { /* not a text field */ }
      }
    }
  }
}
