// One line per test suite of a `tests/run`: passed, failed, skipped (with the reasons).
//
// Reads what the runner left in the reports folder (argv[2]):
//   vitest.json  Vitest's JSON report of the browser client's unit tests
//   cargo.log    `cargo test` output (stdout and stderr): one `Running` line and one
//                `test result:` line per test binary
//   skips.tsv    one line per test that skipped for want of a dependency
//                (crate, test, reason), written by `server/tests/common::skip`; libtest counts
//                those as passed, so they are moved from passed to skipped here
//   node.tap     the Node tests' TAP report: counts from its trailer (nested tests included),
//                reasons from `# SKIP reason` on skipped test points
// A suite that has not run (the runner stopped before it) is reported as not run.
// Exits 1 when any suite failed or did not run.

import { readFileSync, existsSync } from 'node:fs'
import { join } from 'node:path'

const dir = process.argv[2]
if (!dir) {
  console.error('usage: node tests/summary.mjs REPORTS_DIR')
  process.exit(2)
}
const read = (name) => (existsSync(join(dir, name)) ? readFileSync(join(dir, name), 'utf8') : null)

const lines = []
let bad = false
// Failed node tests: name, the error's first lines, where in the test file, the pages' last lines.
const failures = []

function line (suite, passed, failed, skipped) {
  const reasons = skipped.length ? ` (${skipped.join('; ')})` : ''
  lines.push(`${suite}: ${passed} passed, ${failed} failed, ${skipped.length} skipped${reasons}`)
  if (failed > 0) bad = true
}

function notRun (suite) {
  lines.push(`${suite}: not run`)
  bad = true
}

// Vitest.
const vitest = read('vitest.json')
if (vitest === null) {
  notRun('web (vitest)')
} else {
  const v = JSON.parse(vitest)
  const skipped = []
  for (const file of v.testResults ?? []) {
    for (const t of file.assertionResults ?? []) {
      if (t.status === 'pending' || t.status === 'skipped' || t.status === 'todo') {
        skipped.push(`${t.fullName}: skipped`)
      }
    }
  }
  line('web (vitest)', v.numPassedTests, v.numFailedTests, skipped)
}

// Cargo: every test binary and the doc-tests.
const skipsByCrate = new Map()
for (const row of (read('skips.tsv') ?? '').split('\n')) {
  if (!row.trim()) continue
  const [crate, test, ...reason] = row.split('\t')
  if (!skipsByCrate.has(crate)) skipsByCrate.set(crate, [])
  skipsByCrate.get(crate).push(`${test}: ${reason.join(' ')}`)
}
const cargo = read('cargo.log')
if (cargo === null) {
  notRun('cargo test')
} else {
  let suite = null
  let crate = null
  let seen = 0
  let ignoredWhy = []
  for (const text of cargo.split('\n')) {
    const ignored = text.match(/^test (\S+) \.\.\. ignored(?:, (.*))?$/)
    if (ignored) {
      ignoredWhy.push(`${ignored[1]}: ${ignored[2] || '#[ignore]d'}`)
      continue
    }
    const running = text.match(/^\s+Running (.+?) \((?:.*\/)?([^/]+?)-[0-9a-f]+\)\s*$/)
    const doc = text.match(/^\s+Doc-tests (\S+)/)
    if ((running || doc) && suite) {
      // The previous binary never reported a result: it crashed (signal, abort, overflow).
      line(`${suite}: crashed, no result`, 0, 1, [])
    }
    if (running) {
      ignoredWhy = []
      suite = `cargo ${running[1]} (${running[2]})`
      crate = running[2]
      continue
    }
    if (doc) {
      suite = `cargo doc-tests ${doc[1]}`
      crate = null
      continue
    }
    const result = text.match(/^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored/)
    if (result && suite) {
      seen += 1
      const skipped = crate ? (skipsByCrate.get(crate) ?? []) : []
      if (crate) skipsByCrate.delete(crate)
      const ignored = Number(result[3])
      const reasons = [...skipped, ...ignoredWhy]
      for (let i = ignoredWhy.length; i < ignored; i++) reasons.push('#[ignore]d')
      line(suite, Number(result[1]) - skipped.length, Number(result[2]), reasons)
      ignoredWhy = []
      suite = null
    }
  }
  if (suite) line(`${suite}: crashed, no result`, 0, 1, [])
  if (seen === 0) notRun('cargo test')
  // A skip whose binary never reported a result (it crashed mid-run) is still shown.
  for (const [crate, skipped] of skipsByCrate) line(`cargo ${crate} (no result line)`, 0, 1, skipped)
  if (/^error: \d+ targets? failed/m.test(cargo)) bad = true
}

// Node tests (real yjs/y-websocket clients, Chromium).
const tap = read('node.tap')
if (tap === null) {
  notRun('node tests')
} else {
  // Counts from the runner's own trailer (every test, nested ones included); the reasons from
  // the skipped test points at any depth.
  const count = (name) => Number((tap.match(new RegExp(`^# ${name} (\\d+)$`, 'm')) ?? [])[1] ?? 0)
  const passed = count('pass')
  const failed = count('fail') + count('cancelled')
  const skipped = []
  for (const text of tap.split('\n')) {
    const m = text.match(/^\s*(?:not ok|ok) \d+ - (.*?) # (SKIP|TODO)\b ?(.*)$/)
    if (m) skipped.push(`${m[1]}: ${m[3] || m[2].toLowerCase()}`)
  }
  if (skipped.length !== count('skipped') + count('todo')) {
    skipped.push(`(the runner counted ${count('skipped')} skipped and ${count('todo')} todo)`)
  }
  line('node tests', passed, failed, skipped)
  // A failed browser test's last moments (tests/node/lib/browser.mjs writes them for every
  // test): the pages' API calls and the server's log, for a failure that does not reproduce.
  // The same, shortened, is printed again after the summary (below): a CI report that keeps only
  // the end of the output still says why.
  const tapLines = tap.split('\n')
  for (const [i, text] of tapLines.entries()) {
    const m = text.match(/^\s*not ok \d+ - (.*?)$/)
    if (!m || / # (SKIP|TODO)\b/.test(m[1])) continue
    const failure = { name: m[1], error: [], at: null, parts: [] }
    failures.push(failure)
    // The YAML block under the test point: its error's first lines and where in the test file.
    let field = null
    for (const row of tapLines.slice(i + 1)) {
      if (/^\s*\.\.\.$/.test(row) || /^\s*(not ok|ok) \d+ /.test(row)) break
      // A field's key is indented by two spaces (nested tests: more), its lines by two more.
      const key = row.match(/^(\s*)(\w+):/)
      const isKey = key !== null && key[1].length < (tapLines[i].match(/^\s*/)[0].length + 4)
      if (isKey) field = key[2]
      const value = row.trim()
      if (isKey || !value) continue
      if (field === 'error' && failure.error.length < 2) failure.error.push(value)
      if (field === 'stack' && failure.at === null && /\.test\.mjs:\d+/.test(value)) {
        failure.at = value.replace(/^.*\/([^/]+\.test\.mjs:\d+:\d+).*$/, '$1')
      }
    }
    const page = read(`pages/${m[1].replace(/[^A-Za-z0-9]+/g, '-').slice(0, 80)}.log`)
    if (page === null) continue
    console.log(`== the last moments of "${m[1]}" (target/test-reports/pages)`)
    for (const part of page.split(/^(?===)/m)) {
      const [head, ...rest] = part.trimEnd().split('\n')
      console.log([head, ...rest.slice(-60)].join('\n'))
      failure.parts.push([head, ...rest.slice(-2)])
    }
  }
}

console.log('== summary')
for (const l of lines) console.log(l)
// Last, so that the end of the output says why: the first failed node test, short (the whole
// of it is above the summary), and the names of any others.
const [first, ...others] = failures
if (first) {
  console.log(`== why "${first.name}" failed`)
  for (const e of first.error) console.log(`  ${e.slice(0, 300)}`)
  if (first.at) console.log(`  at ${first.at}`)
  for (const [head, ...last] of first.parts) console.log(`  ${head}\n${last.map((l) => `    ${l.slice(0, 200)}`).join('\n')}`)
  for (const f of others) console.log(`== also failed: "${f.name}" (above)`)
}
process.exit(bad ? 1 : 0)
