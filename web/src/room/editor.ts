// The editor: one CodeMirror view bound through y-codemirror.next to the open file's Y.Text,
// with remote cursors labelled by the identity the server stamped on each connection.

import * as Y from 'yjs'
import type { Awareness } from 'y-protocols/awareness'
import { yCollab } from 'y-codemirror.next'
import { ChangeSet, Compartment, EditorState, type Extension } from '@codemirror/state'
import { EditorView, keymap, lineNumbers, highlightActiveLine, drawSelection, highlightActiveLineGutter } from '@codemirror/view'
import { defaultKeymap, indentWithTab } from '@codemirror/commands'
import { searchKeymap, highlightSelectionMatches } from '@codemirror/search'
import { syntaxHighlighting, indentOnInput, bracketMatching, StreamLanguage } from '@codemirror/language'
import { classHighlighter } from '@lezer/highlight'
import { javascript } from '@codemirror/lang-javascript'
import { rust } from '@codemirror/lang-rust'
import { python } from '@codemirror/lang-python'
import { languageOf, type Language } from '../files'
import { rebase } from '../rebase'

/** The highlighting built into the bundle, if `lang` is one of those. */
function builtIn (lang: Language): Extension | null {
  switch (lang) {
    case 'javascript': return javascript()
    case 'typescript': return javascript({ typescript: true })
    case 'rust': return rust()
    case 'python': return python()
    case 'plain': return []
    default: return null
  }
}

/** The other languages, each a chunk of its own fetched the first time a file of it opens. */
export async function loadLanguage (lang: Language): Promise<Extension> {
  switch (lang) {
    case 'markdown': return (await import('@codemirror/lang-markdown')).markdown()
    case 'json': return (await import('@codemirror/lang-json')).json()
    case 'html': return (await import('@codemirror/lang-html')).html()
    case 'css': return (await import('@codemirror/lang-css')).css()
    case 'cpp': return (await import('@codemirror/lang-cpp')).cpp()
    case 'java': return (await import('@codemirror/lang-java')).java()
    case 'go': return (await import('@codemirror/lang-go')).go()
    case 'yaml': return (await import('@codemirror/lang-yaml')).yaml()
    case 'shell': return StreamLanguage.define((await import('@codemirror/legacy-modes/mode/shell')).shell)
    case 'toml': return StreamLanguage.define((await import('@codemirror/legacy-modes/mode/toml')).toml)
    default: return builtIn(lang) ?? []
  }
}

/** Applies `changes` (made for `text`'s content as it is) to `text`, in one transaction. */
function applyToText (text: Y.Text, changes: ChangeSet): void {
  const run = (): void => {
    let shift = 0
    changes.iterChanges((fromA, toA, _fromB, _toB, inserted) => {
      const at = fromA + shift
      if (toA > fromA) text.delete(at, toA - fromA)
      const s = inserted.toString()
      if (s) text.insert(at, s)
      shift += s.length - (toA - fromA)
    })
  }
  if (text.doc) text.doc.transact(run)
  else run()
}

/** The editor's accessible name for the file at `path`. */
function labelFor (path: string): Extension {
  return EditorView.contentAttributes.of({ 'aria-label': `Editor: ${path}` })
}

export class Editor {
  private view: EditorView | null = null
  private readonly access = new Compartment()
  private readonly syntax = new Compartment()
  /** The editor's accessible name, which names the open file. */
  private readonly label = new Compartment()
  /** The binding to the open file's text: empty while the file is detached. */
  private readonly collab = new Compartment()
  /** While detached: the text the view showed when its file left the document, and the changes
   *  typed since (kept in the view alone, until `rebind`). */
  private detached: { base: string, local: ChangeSet } | null = null
  /** Called (during the view's update: defer what dispatches) when someone types into the
   *  detached view. */
  onDetachedEdit: (() => void) | null = null
  /** Undo history per file, tied to the text it tracks (a file replaced by another client gets
   *  a fresh history). */
  private readonly undo = new Map<string, { text: Y.Text, undo: Y.UndoManager }>()
  private editable = false
  path: string | null = null

  constructor (private readonly parent: HTMLElement, private readonly awareness: Awareness) {}

  open (path: string, text: Y.Text): void {
    this.close()
    this.path = path
    const undo = this.undoFor(path, text)
    const state = EditorState.create({
      doc: text.toString(),
      extensions: [
        lineNumbers(),
        highlightActiveLineGutter(),
        highlightActiveLine(),
        drawSelection(),
        indentOnInput(),
        bracketMatching(),
        highlightSelectionMatches(),
        // Token classes (`tok-keyword`, ...) coloured by the page's stylesheet, per theme.
        syntaxHighlighting(classHighlighter),
        keymap.of([...defaultKeymap, ...searchKeymap, indentWithTab]),
        this.syntax.of(builtIn(languageOf(path)) ?? []),
        this.access.of(this.accessExt()),
        this.collab.of(yCollab(text, this.awareness, { undoManager: undo })),
        EditorView.updateListener.of((u) => {
          if (this.detached && u.docChanged) {
            this.detached.local = this.detached.local.compose(u.changes)
            this.onDetachedEdit?.()
          }
        }),
        this.label.of(labelFor(path)),
      ],
    })
    this.view = new EditorView({ state, parent: this.parent })
    this.loadSyntax(this.view, path)
  }

  /** Highlighting for `path` that is not built in, once its chunk has loaded (while `view`
   *  still shows `path`). */
  private loadSyntax (view: EditorView, path: string): void {
    const lang = languageOf(path)
    if (builtIn(lang) !== null) return
    loadLanguage(lang)
      .then((ext) => { if (this.view === view && this.path === path) view.dispatch({ effects: this.syntax.reconfigure(ext) }) })
      .catch(() => { /* offline, or the chunk is gone: the file stays plain text */ })
  }

  private accessExt (): Extension {
    return [EditorState.readOnly.of(!this.editable), EditorView.editable.of(this.editable)]
  }

  /** Read-only for those without `edit`; follows rights as they change. */
  setEditable (editable: boolean): void {
    if (editable === this.editable) return
    this.editable = editable
    this.view?.dispatch({ effects: this.access.reconfigure(this.accessExt()) })
    this.parent.classList.toggle('read-only', !editable)
  }

  focus (): void { this.view?.focus() }

  /** Scrolls `index` (a character offset) of the open file into the middle of the view. */
  reveal (index: number): void {
    const v = this.view
    if (!v) return
    const pos = Math.max(0, Math.min(index, v.state.doc.length))
    v.dispatch({ effects: EditorView.scrollIntoView(pos, { y: 'center' }) })
  }

  private undoFor (path: string, text: Y.Text): Y.UndoManager {
    let entry = this.undo.get(path)
    if (!entry || entry.text !== text) {
      entry?.undo.destroy()
      entry = { text, undo: new Y.UndoManager(text) }
      this.undo.set(path, entry)
    }
    return entry.undo
  }

  /** The open file left the document (renamed, moved, deleted or replaced by someone else):
   *  the view stays as it is, focus, cursor and all, unbound from any text; what is typed
   *  meanwhile stays in it until [`rebind`] puts it into the text the file became. */
  detach (): void {
    const v = this.view
    if (!v || this.detached) return
    this.detached = { base: v.state.doc.toString(), local: ChangeSet.empty(v.state.doc.length) }
    v.dispatch({ effects: this.collab.reconfigure([]) })
  }

  /** Whether the view is detached, whether anything was typed in it since, and what it showed
   *  when it was detached (`rebind` adds the typing to a text that holds that). */
  detachedTyping (): { typed: boolean, base: string } | null {
    if (!this.detached || !this.view) return null
    return { typed: !this.detached.local.empty, base: this.detached.base }
  }

  /** Binds the detached view to `text`, the file it became at `path`: what the text gained
   *  since (typing the room carried there, others' edits) shows in the view, and what was
   *  typed in the view meanwhile goes into the text, each rebased over the other; the cursor
   *  follows. */
  rebind (path: string, text: Y.Text): void {
    const v = this.view
    const d = this.detached
    if (!v || !d) { this.open(path, text); return }
    this.detached = null
    this.onDetachedEdit = null
    const { toText, toView } = rebase(d.base, text.toString(), d.local)
    applyToText(text, toText)
    v.dispatch({ changes: toView })
    if (v.state.doc.toString() !== text.toString()) {
      // Never expected; the text is what everyone sees, so the view shows it.
      v.dispatch({ changes: { from: 0, to: v.state.doc.length, insert: text.toString() } })
    }
    const old = this.path
    this.path = path
    if (old !== null && old !== path) this.forgetHistory(old)
    v.dispatch({
      effects: [
        this.collab.reconfigure(yCollab(text, this.awareness, { undoManager: this.undoFor(path, text) })),
        this.syntax.reconfigure(builtIn(languageOf(path)) ?? []),
        this.label.reconfigure(labelFor(path)),
      ],
    })
    this.loadSyntax(v, path)
  }

  private forgetHistory (path: string): void {
    this.undo.get(path)?.undo.destroy()
    this.undo.delete(path)
  }

  /** The file was deleted or renamed away. */
  forget (path: string): void {
    this.forgetHistory(path)
    if (this.path === path) this.close()
  }

  close (): void {
    this.view?.destroy()
    this.view = null
    this.path = null
    this.detached = null
    this.onDetachedEdit = null
    // Not editing anything: no cursor to show to others.
    this.awareness.setLocalStateField('cursor', null)
  }

  destroy (): void {
    this.close()
    for (const u of this.undo.values()) u.undo.destroy()
    this.undo.clear()
  }
}
