// What a person is told when their own rights in a room change: in plain words, naming who
// changed them when the server says so.

import type { Capability } from './api'
import { ROLES } from './caps'

/** A role's meaning, in one line. */
export const ROLE_MEANING: Record<string, string> = {
  owner: 'can do everything here, including inviting, approving and deleting the room',
  editor: 'can edit files and run commands',
  viewer: 'can watch, but not edit or type',
}

/** The preset `caps` is exactly, if any. */
export function roleOf (caps: readonly Capability[]): string | null {
  const mine = new Set(caps)
  for (const [role, preset] of Object.entries(ROLES)) {
    if (preset.length === mine.size && preset.every((c) => mine.has(c))) return role
  }
  return null
}

function article (role: string): string {
  return /^[aeiou]/.test(role) ? `an ${role}` : `a ${role}`
}

/** The notice for a change from `before` to `after` (made by `by`, an email, when known), or
 *  `null` when there is nothing to say: no change, the first rights this page learns, or the
 *  room lost (the page says that itself). */
export function rightsNotice (before: readonly Capability[], after: readonly Capability[], by?: string | null): string | null {
  if (before.length === 0 || after.length === 0) return null
  const had = new Set(before)
  const has = new Set(after)
  if (had.size === has.size && [...had].every((c) => has.has(c))) return null
  const role = roleOf(after)
  const made = (role: string): string =>
    `${by ? `${by} made you ${article(role)}` : `You are now ${article(role)}`}: you ${ROLE_MEANING[role]}.`
  // From one role to another: the new role and what it means.
  if (role !== null && roleOf(before) !== null) return made(role)
  // Otherwise (a grant, or one that lapsed): what changed that matters most.
  const typing = had.has('type') && had.has('edit')
  const types = has.has('type') && has.has('edit')
  const who = by ? ` (${by})` : ''
  if (!had.has('edit') && has.has('edit')) return `You can edit again${who}.`
  if (had.has('edit') && !has.has('edit')) return `You can no longer edit files${who}.`
  if (!typing && types) return `You can type again${who}.`
  if (typing && !types) return `You can no longer type in the terminal${who}.`
  if (role !== null) return made(role)
  const gained = after.filter((c) => !had.has(c))
  const lost = before.filter((c) => !has.has(c))
  const parts = [
    gained.length ? `you can now ${gained.map(words).join(', ')}` : '',
    lost.length ? `you can no longer ${lost.map(words).join(', ')}` : '',
  ].filter(Boolean)
  return `Your rights changed${who}: ${parts.join('; ')}.`
}

/** A capability as what it lets someone do. */
export function words (c: Capability): string {
  const w: Record<string, string> = {
    observe: 'watch the room',
    edit: 'edit files',
    type: 'type in the terminal',
    approve: 'approve requests',
    invite: 'invite people',
    connect_repo: 'connect repositories',
    add_secret: 'add secrets',
    spend: 'set and spend budgets',
    export: 'fork and export',
    publish: 'publish previews',
    revoke: 'remove people and lower rights',
    delete: 'delete the room',
  }
  return w[c] ?? c
}

/** A participant's role in one line: what it means, and what they hold beyond it or lack. */
/** Capabilities as what they let someone do, in one phrase: "watch the room, edit files and
 *  fork and export". */
export function capsInWords (caps: readonly Capability[]): string {
  const said = caps.map(words)
  return said.length > 1 ? `${said.slice(0, -1).join(', ')} and ${said[said.length - 1]}` : said.join('')
}

export function roleLine (role: string, caps: readonly Capability[]): string {
  const preset = ROLES[role] ?? []
  const meaning = ROLE_MEANING[role]
  const extra = caps.filter((c) => !preset.includes(c))
  const lacking = preset.filter((c) => !caps.includes(c))
  const parts = [meaning ? `${meaning[0].toUpperCase()}${meaning.slice(1)}.` : `Custom rights.`]
  if (extra.length) parts.push(`Also can ${extra.map(words).join(', ')}.`)
  if (lacking.length) parts.push(`Cannot ${lacking.map(words).join(', ')}.`)
  return parts.join(' ')
}

/** What an approval lets happen, as the end of "your request to …". */
export function requestWords (action: string): string {
  const w: Record<string, string> = {
    export: 'export files',
    fork: 'fork the room',
    public_preview: 'publish a public preview',
    add_secret: 'add a secret',
    set_budget: 'raise the budget',
    force_push: 'force-push',
    restore_checkpoint: 'restore a checkpoint',
    run_command: 'run a command',
  }
  return w[action] ?? action.replace(/_/g, ' ')
}

/** The notice for a request of this person's that someone decided (or that lapsed); `null`
 *  while it waits. `by` is the decider's name. */
export function decisionNotice (action: string, state: string, by: string | null): string | null {
  const what = `your request to ${requestWords(action)}`
  switch (state) {
    // `used`: approved, and already acted on.
    case 'approved': case 'used': return `${by ?? 'Someone'} approved ${what}.`
    case 'denied': return `${by ?? 'Someone'} refused ${what}.`
    case 'expired': return `Nobody decided ${what} in time; it expired.`
    default: return null
  }
}

/** Who `id` is in a room, in words: a person by their email, an agent by its name and who
 *  brought it in. */
export function whoIs (
  id: string | null,
  people: readonly { user_id: string, email: string }[],
  agents: readonly { agent_id: string, name: string, sponsor_email: string }[] = [],
): string {
  if (!id) return 'Someone'
  const person = people.find((p) => p.user_id === id)
  if (person) return person.email
  const agent = agents.find((a) => a.agent_id === id)
  if (agent) return `${agent.name} (an agent brought in by ${agent.sponsor_email || 'someone no longer here'})`
  return 'Someone no longer in the room'
}

/** `3600` -> "1 hour", and so on. */
function span (s: number): string {
  const [n, unit] = s % 86_400 === 0 ? [s / 86_400, 'day'] : s % 3600 === 0 ? [s / 3600, 'hour'] : s % 60 === 0 ? [s / 60, 'minute'] : [s, 'second']
  return `${n} ${unit}${n === 1 ? '' : 's'}`
}

/** A command line as one would type it. */
function commandLine (argv: readonly string[]): string {
  // How the E2B SDKs and `sh -c` run a line: the line is what was asked.
  if (argv.length === 4 && /(^|\/)(ba)?sh$/.test(argv[0]) && argv[2] === '-c') return argv[3]
  if (argv.length === 3 && /(^|\/)(ba)?sh$/.test(argv[0]) && argv[1] === '-c') return argv[2]
  return argv.map((a) => /^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, "'\\''")}'`).join(' ')
}

/** What an approval asks for, in words, after "asks to" (the exact parameters are shown beside
 *  it: this is for reading, they are what is approved). */
export function approvalWords (action: string, params: unknown): string {
  const p = (params ?? {}) as Record<string, unknown>
  const str = (v: unknown): string | null => typeof v === 'string' ? v : null
  switch (action) {
    case 'run_command': {
      if (str(p.terminal) !== null) return `type \`${str(p.terminal)!.trimEnd()}\` into a terminal`
      if (str(p.readiness) !== null) return `run \`${str(p.readiness)}\` at each start of the sandbox`
      if (!Array.isArray(p.argv)) return 'run a command'
      const where = str(p.cwd) ? ` in ${str(p.cwd)}` : ''
      const how = p.terminal !== undefined ? ' on a terminal of its own (what is typed there asks again, line by line)'
        : p.stdin === true ? ' with input (what is typed into it asks again, line by line)' : ''
      return `run \`${commandLine(p.argv.map(String))}\`${where}${how}`
    }
    case 'public_preview':
      return typeof p.port === 'number'
        ? `make port ${p.port} public to anyone with the link${typeof p.ttl_s === 'number' ? ` for ${span(p.ttl_s)}` : ''}`
        : 'publish a public preview'
    case 'export':
      if (p.workspace === true) return 'download the whole workspace'
      if (Array.isArray(p.files)) {
        const n = p.files.length
        return `export ${n} file${n === 1 ? '' : 's'}: ${p.files.slice(0, 5).join(', ')}${n > 5 ? ', …' : ''}`
      }
      if (str(p.format)) return `export the repository's changes as a ${str(p.format)}`
      return 'export files'
    case 'allow_egress': return str(p.rule) ? `open the network to ${str(p.rule)}` : 'open the network'
    case 'add_secret':
      return str(p.name) ? `add the secret ${str(p.name)}${Array.isArray(p.hosts) ? ` for ${p.hosts.join(', ')}` : ''}` : 'add a secret'
    case 'force_push': return str(p.message) ? `force-push "${str(p.message)}"` : 'force-push'
    default: return requestWords(action)
  }
}

/** The notice to someone who can decide: who asks what, and where to decide. */
export function askedNotice (who: string, action: string, params: unknown): string {
  return `${who} asks to ${approvalWords(action, params)}. Decide in the Approvals panel.`
}
