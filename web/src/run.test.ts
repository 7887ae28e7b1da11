import { describe, expect, it } from 'vitest'
import { checkCommand, manifestCommand, runCommand, withManifestCommand } from './run'

const files = (m: Record<string, string>): [string[], (p: string) => string | undefined] =>
  [Object.keys(m), (p) => m[p]]

describe('the run command', () => {
  it('comes from coderoom.toml first', () => {
    expect(runCommand(...files({ 'coderoom.toml': 'run = "python3 app.py --port 8000"\n', 'main.py': '' })))
      .toEqual({ command: 'python3 app.py --port 8000', from: 'coderoom.toml' })
    expect(manifestCommand("# the room\nrun = 'make test'  # fast\n")).toBe('make test')
    expect(manifestCommand('run = "echo \\"hi\\" \\\\ there"')).toBe('echo "hi" \\ there')
  })

  it('ignores a run key inside a table, an empty one, and one of several lines', () => {
    expect(manifestCommand('[tool]\nrun = "x"\n')).toBeNull()
    expect(manifestCommand('run = ""\n')).toBeNull()
    expect(manifestCommand('run = "a\\nb"\n')).toBeNull()
    // An unusable manifest falls back to the guess.
    expect(runCommand(...files({ 'coderoom.toml': 'run = ""', 'main.py': '' }))?.command).toBe('python3 main.py')
  })

  it('is guessed for the common cases', () => {
    const guess = (m: Record<string, string>): string | undefined => runCommand(...files(m))?.command
    expect(guess({ 'main.py': '', 'util.py': '' })).toBe('python3 main.py')
    expect(guess({ 'src/app.py': '' })).toBe('python3 src/app.py')
    expect(guess({ 'a.py': '', 'b.py': '' })).toBeUndefined()
    expect(guess({ 'Cargo.toml': '', 'src/main.rs': '' })).toBe('cargo run')
    expect(guess({ 'package.json': '{"scripts":{"start":"node s.js","dev":"x"}}' })).toBe('npm start')
    expect(guess({ 'package.json': '{"scripts":{"dev":"vite"}}' })).toBe('npm run dev')
    expect(guess({ 'package.json': '{"main":"server.js"}' })).toBe('node server.js')
    expect(guess({ 'package.json': '{"main":"$(rm -rf /)"}' })).toBeUndefined()
    expect(guess({ 'package.json': '{ half typed' })).toBeUndefined()
    expect(guess({ 'main.c': '' })).toBe('gcc -o main main.c && ./main')
    expect(guess({ 'go.mod': '', 'main.go': '' })).toBe('go run .')
    expect(guess({ 'notes.md': '' })).toBeUndefined()
    expect(runCommand(...files({ 'main.py': '' }))?.from).toBe('guessed from main.py')
  })

  it('is written into coderoom.toml, replacing the old line and keeping the rest', () => {
    expect(withManifestCommand('', 'python3 main.py')).toBe('run = "python3 main.py"\n')
    expect(withManifestCommand('# mine\nrun = "old"\n[tool]\nrun = "x"\n', 'echo "a"'))
      .toBe('# mine\nrun = "echo \\"a\\""\n[tool]\nrun = "x"\n')
    expect(withManifestCommand('[tool]\nrun = "x"', 'make')).toBe('run = "make"\n[tool]\nrun = "x"\n')
    // What is written reads back the same.
    const odd = 'printf "%s\\n" \'q\' \\ end'
    expect(manifestCommand(withManifestCommand('', odd))).toBe(odd)
  })

  it('must be one usable line', () => {
    expect(checkCommand('  ')).toMatch(/Type the command/)
    expect(checkCommand('a\nb')).toMatch(/One line/)
    expect(checkCommand('x'.repeat(501))).toMatch(/At most 500/)
    expect(checkCommand('python3 main.py')).toBeNull()
  })
})
