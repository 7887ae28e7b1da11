// The file tree, built from the paths in the document's `files` map.

export interface TreeNode {
  name: string
  /** Full path for files; the directory's path (with a trailing slash) for directories. */
  path: string
  dir: boolean
  children: TreeNode[]
}

export function buildTree (paths: Iterable<string>): TreeNode[] {
  const root: TreeNode = { name: '', path: '', dir: true, children: [] }
  for (const path of paths) {
    const parts = path.split('/').filter(Boolean)
    let node = root
    parts.forEach((name, i) => {
      const last = i === parts.length - 1
      let child = node.children.find((c) => c.name === name && c.dir === !last)
      if (!child) {
        child = { name, path: last ? path : parts.slice(0, i + 1).join('/') + '/', dir: !last, children: [] }
        node.children.push(child)
      }
      node = child
    })
  }
  sort(root)
  return root.children
}

function sort (n: TreeNode): void {
  n.children.sort((a, b) => (a.dir === b.dir ? a.name.localeCompare(b.name) : a.dir ? -1 : 1))
  n.children.forEach(sort)
}

const MAX_PATH = 4096

/** A workspace-relative path as the server accepts it, or the reason it is not one. */
export function checkPath (raw: string): { ok: true, path: string } | { ok: false, reason: string } {
  const path = raw.trim().replace(/^\.\//, '')
  if (!path) return { ok: false, reason: 'Give the file a name' }
  if (path.length > MAX_PATH) return { ok: false, reason: 'That path is too long' }
  if (path.startsWith('/')) return { ok: false, reason: 'Use a path inside the workspace (no leading /)' }
  if (path.endsWith('/')) return { ok: false, reason: 'A file name cannot end with /' }
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f\\]/.test(path)) return { ok: false, reason: 'Control characters and backslashes are not allowed' }
  const parts = path.split('/')
  if (parts.some((p) => p === '' || p === '.' || p === '..')) return { ok: false, reason: 'Empty, . and .. path parts are not allowed' }
  return { ok: true, path }
}

/** CodeMirror language for a file name. */
/** The languages the editor highlights: the first four built in, the others loaded when a file
 *  of theirs is first opened. */
export type Language = 'javascript' | 'typescript' | 'rust' | 'python' | 'markdown' | 'json' | 'html' | 'css'
  | 'cpp' | 'java' | 'go' | 'yaml' | 'shell' | 'toml' | 'plain'

const BY_EXTENSION: Record<string, Language> = {
  js: 'javascript', mjs: 'javascript', cjs: 'javascript', jsx: 'javascript',
  ts: 'typescript', tsx: 'typescript', mts: 'typescript',
  rs: 'rust', py: 'python', md: 'markdown', markdown: 'markdown', json: 'json',
  html: 'html', htm: 'html', css: 'css',
  c: 'cpp', h: 'cpp', cc: 'cpp', cpp: 'cpp', cxx: 'cpp', hpp: 'cpp', hh: 'cpp',
  java: 'java', go: 'go', yml: 'yaml', yaml: 'yaml', sh: 'shell', bash: 'shell', toml: 'toml',
}

export function languageOf (path: string): Language {
  const name = path.slice(path.lastIndexOf('/') + 1).toLowerCase()
  if (!name.includes('.')) return 'plain'
  return BY_EXTENSION[name.slice(name.lastIndexOf('.') + 1)] ?? 'plain'
}

/**
 * The moves that rename folder `from` (a tree path, with its trailing slash) to `to`: one per
 * file under it. Refused when a file of the new folder's would take a path already in use.
 */
export function folderMoves (paths: Iterable<string>, from: string, to: string): { ok: true, moves: Array<[string, string]> } | { ok: false, reason: string } {
  const all = [...paths]
  const prefix = from.endsWith('/') ? from : `${from}/`
  const target = to.replace(/\/+$/, '')
  if (`${target}/` === prefix) return { ok: false, reason: 'That is the folder\'s name already' }
  if (`${target}/`.startsWith(prefix)) return { ok: false, reason: 'A folder cannot move inside itself' }
  const moves: Array<[string, string]> = all.filter((p) => p.startsWith(prefix)).map((p) => [p, `${target}/${p.slice(prefix.length)}`])
  const taken = new Set(all)
  const clash = moves.find(([, p]) => taken.has(p))
  if (clash) return { ok: false, reason: `${clash[1]} already exists` }
  if (taken.has(target)) return { ok: false, reason: `${target} is a file` }
  return { ok: true, moves }
}

/** `path`, or `name (2).ext`, `name (3).ext`, ... when `taken` (as the server names a restored
 *  file whose path was taken). */
export function freePath (path: string, taken: (p: string) => boolean): string {
  if (!taken(path)) return path
  const cut = path.lastIndexOf('/') + 1
  const dir = path.slice(0, cut)
  const name = path.slice(cut)
  const dot = name.lastIndexOf('.')
  const [stem, ext] = dot > 0 ? [name.slice(0, dot), name.slice(dot)] : [name, '']
  for (let n = 2; ; n++) {
    const p = `${dir}${stem} (${n})${ext}`
    if (!taken(p)) return p
  }
}

/**
 * Where a file that left the tree went, when the same change added the file it became: the
 * added file of the same name (a folder rename), or the only file added (a rename).
 */
export function movedTo (gone: string, added: string[]): string | null {
  const name = gone.split('/').pop()
  const same = added.filter((p) => p.split('/').pop() === name)
  if (same.length === 1) return same[0]
  return added.length === 1 ? added[0] : null
}

/** Paths matching `query` for quick open, best first, at most `limit`: the query's characters
 *  in order (any case, spaces ignored), a match in the file's own name ranked above one across
 *  folders, earlier and tighter matches above later ones, then shorter paths. An empty query
 *  lists the paths as they are, shortest first. */
export function quickMatches (paths: Iterable<string>, query: string, limit = 20): string[] {
  const q = query.toLowerCase().replace(/\s+/g, '')
  const scored: { path: string, score: number }[] = []
  for (const path of paths) {
    const lower = path.toLowerCase()
    const name = lower.slice(lower.lastIndexOf('/') + 1)
    const inName = subsequence(name, q)
    const inPath = inName ?? subsequence(lower, q)
    if (inPath === null) continue
    // Lower is better: a match within the name, then how spread and how late it is.
    const score = (inName !== null ? 0 : 10_000) + inPath.spread * 10 + inPath.start + path.length / 1000
    scored.push({ path, score })
  }
  return scored.sort((a, b) => a.score - b.score || a.path.localeCompare(b.path)).slice(0, limit).map((s) => s.path)
}

/** Where `q`'s characters occur in order in `text` (first match, greedy): its start and how
 *  many characters it spans beyond `q`'s own; `null` when they do not. */
function subsequence (text: string, q: string): { start: number, spread: number } | null {
  if (q === '') return { start: 0, spread: 0 }
  let start = -1
  let i = 0
  for (let j = 0; j < text.length && i < q.length; j++) {
    if (text[j] === q[i]) {
      if (i === 0) start = j
      i++
      if (i === q.length) return { start, spread: j - start + 1 - q.length }
    }
  }
  return null
}

/** A line of a file that contains the searched text. */
export interface Hit { path: string, line: number, offset: number, text: string }

/** Where `query` occurs (any case) in `texts` (path -> text), by path then line, at most
 *  `limit` hits; each hit's `offset` is its character offset in the file, `text` its line
 *  (cut to 200 characters around the match). An empty query finds nothing. */
export function searchFiles (texts: Iterable<[string, string]>, query: string, limit = 200): Hit[] {
  const q = query.toLowerCase()
  if (!q) return []
  const hits: Hit[] = []
  for (const [path, text] of [...texts].sort((a, b) => a[0].localeCompare(b[0]))) {
    let offset = 0
    const lines = text.split('\n')
    for (let i = 0; i < lines.length; i++) {
      const at = lines[i].toLowerCase().indexOf(q)
      if (at >= 0) {
        const from = Math.max(0, at - 80)
        hits.push({ path, line: i + 1, offset: offset + at, text: lines[i].slice(from, from + 200) })
        if (hits.length >= limit) return hits
      }
      offset += lines[i].length + 1
    }
  }
  return hits
}

/** The largest file the room's document takes (the server's own limit). */
export const MAX_TEXT_BYTES = 1 << 20

/** `bytes` as the text of a file for the document, or why it cannot be one: UTF-8, no NUL, at
 *  most [`MAX_TEXT_BYTES`] (what the sandbox's file sync takes in too). */
export function asText (bytes: Uint8Array): { ok: true, text: string } | { ok: false, reason: string } {
  if (bytes.length > MAX_TEXT_BYTES) return { ok: false, reason: 'is larger than 1 MiB' }
  let text: string
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes)
  } catch {
    return { ok: false, reason: 'is not UTF-8 text' }
  }
  if (text.includes('\u0000')) return { ok: false, reason: 'is not text (it holds NUL bytes)' }
  return { ok: true, text }
}
