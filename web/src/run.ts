// The room's run command: what the Run button (and Ctrl/Cmd+Enter) types into the shared
// terminal. It lives in the room, in `coderoom.toml` at the workspace's root (`run = "..."`);
// without one it is guessed from the files, for the common cases.

export interface RunCommand {
  command: string
  /** Where it came from, in words: "coderoom.toml", "guessed from main.py". */
  from: string
}

/** The manifest file that holds the run command. */
export const MANIFEST = 'coderoom.toml'
/** Longest run command kept (the terminal takes it as one line). */
export const MAX_COMMAND = 500

/** `run = "..."` (or `'...'`) from a coderoom.toml, if it has one that is usable. */
export function manifestCommand (toml: string): string | null {
  for (const raw of toml.split('\n')) {
    const line = raw.trim()
    if (line.startsWith('[')) return null // a table: `run` belongs to the top level only
    const m = /^run\s*=\s*("(?:[^"\\]|\\.)*"|'[^']*')\s*(?:#.*)?$/.exec(line)
    if (!m) continue
    const value = m[1]
    const command = value.startsWith("'")
      ? value.slice(1, -1)
      : value.slice(1, -1).replace(/\\(["\\nt])/g, (_s, c: string) => ({ n: '\n', t: '\t' })[c] ?? c)
    return usable(command) ? command : null
  }
  return null
}

function usable (command: string): boolean {
  return command.trim() !== '' && command.length <= MAX_COMMAND && !/[\n\r\0]/.test(command)
}

/** The toml with its `run` line set to `command` (added at the top when it has none). */
export function withManifestCommand (toml: string, command: string): string {
  const escaped = command.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\t/g, '\\t')
  const line = `run = "${escaped}"`
  const lines = toml === '' ? [] : toml.split('\n')
  const at = lines.findIndex((l, i) => /^\s*run\s*=/.test(l) && !lines.slice(0, i).some((p) => p.trim().startsWith('[')))
  if (at >= 0) lines[at] = line
  else lines.unshift(line)
  const out = lines.join('\n')
  return out.endsWith('\n') ? out : `${out}\n`
}

/** Why a command cannot be the run command, or null when it can. */
export function checkCommand (command: string): string | null {
  if (command.trim() === '') return 'Type the command that runs this room.'
  if (command.length > MAX_COMMAND) return `At most ${MAX_COMMAND} characters.`
  if (/[\n\r\0]/.test(command)) return 'One line only.'
  return null
}

/** The run command: coderoom.toml's, else a guess from the files at hand. `read` gives a file's
 *  text (undefined when there is no such file). */
export function runCommand (paths: readonly string[], read: (path: string) => string | undefined): RunCommand | null {
  const toml = read(MANIFEST)
  if (toml !== undefined) {
    const command = manifestCommand(toml)
    if (command) return { command, from: MANIFEST }
  }
  const has = (p: string): boolean => paths.includes(p)
  const guessed = (command: string, file: string): RunCommand => ({ command, from: `guessed from ${file}` })
  if (has('Cargo.toml')) return guessed('cargo run', 'Cargo.toml')
  if (has('package.json')) {
    try {
      const pkg = JSON.parse(read('package.json') ?? '') as { scripts?: Record<string, unknown>, main?: unknown }
      if (typeof pkg.scripts?.start === 'string') return guessed('npm start', 'package.json')
      if (typeof pkg.scripts?.dev === 'string') return guessed('npm run dev', 'package.json')
      if (typeof pkg.main === 'string' && safePath(pkg.main)) return guessed(`node ${pkg.main}`, 'package.json')
    } catch { /* not JSON yet (being typed): fall through */ }
  }
  if (has('main.py')) return guessed('python3 main.py', 'main.py')
  const python = paths.filter((p) => p.endsWith('.py'))
  if (python.length === 1 && safePath(python[0])) return guessed(`python3 ${python[0]}`, python[0])
  if (has('main.go') || has('go.mod')) return guessed('go run .', has('go.mod') ? 'go.mod' : 'main.go')
  if (has('Makefile')) return guessed('make', 'Makefile')
  if (has('main.c')) return guessed('gcc -o main main.c && ./main', 'main.c')
  if (has('index.js')) return guessed('node index.js', 'index.js')
  if (has('main.sh')) return guessed('sh main.sh', 'main.sh')
  return null
}

/** A path that can go into a command line as it is (no quoting needed). */
function safePath (p: string): boolean {
  return /^[A-Za-z0-9._/-]+$/.test(p) && !p.startsWith('-')
}
