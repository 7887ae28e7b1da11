// The audit log in sentences: who did what, by name, with the raw record one click away.

import type { AuditRecord, Capability } from './api'
import { roleOf, words } from './notices'
import { bytesText } from './sandbox'

type Details = Record<string, unknown>

function str (v: unknown): string | null {
  return typeof v === 'string' && v !== '' ? v : null
}

function article (role: string): string {
  return /^[aeiou]/.test(role) ? `an ${role}` : `a ${role}`
}

/** What `action` lets someone do, as the end of "tried to …". */
function attempt (action: string): string {
  const w: Record<string, string> = {
    edit: 'edit a file',
    type: 'type in the terminal',
    terminal_input: 'type in the terminal',
    observe: 'watch the room',
    exec: 'run a command',
    run_command: 'run a command',
    set_readiness: 'set the readiness step',
    public_preview: 'publish a public preview',
    publish: 'open a preview',
    export: 'export files',
    fork: 'fork the room',
    accept_invite: 'join with an invite',
  }
  return w[action] ?? action.replace(/_/g, ' ')
}

/** Who acted, for sentences: the server, an agent by its name and who brought it in (`agent`
 *  knows the room's agents), else a person by email. */
export function actorText (r: AuditRecord, name: (id: string) => string, agent: (id: string) => string | null = () => null): string {
  if (r.actor === 'system' || r.actor === '') return 'The server'
  if (r.actor_agent) return `${r.actor_agent.name} (an agent brought in by ${r.actor_agent.sponsor_email ?? 'someone no longer here'})`
  const a = agent(r.actor)
  if (a) return a
  // An agent's account has no mailbox: its made-up address never stands for it.
  if (r.actor_email?.endsWith('@agents.invalid')) return 'An agent no longer in the room'
  // A chosen name with the address it belongs to: a name alone could be anyone's.
  if (r.actor_name) return r.actor_email ? `${r.actor_name} (${r.actor_email})` : r.actor_name
  return r.actor_email ?? name(r.actor)
}

/** One record as a sentence. `name` gives a person's or agent's name for an id the record
 *  does not name itself; `agent` names an agent actor with its sponsor. */
export function auditSentence (r: AuditRecord, name: (id: string) => string, agent: (id: string) => string | null = () => null): string {
  const d: Details = r.details !== null && typeof r.details === 'object' ? r.details as Details : {}
  const system = r.actor === 'system' || r.actor === ''
  const who = actorText(r, name, agent)
  const target = r.target_email ?? (str(d.target) ? name(str(d.target)!) : 'someone')
  // Reasons name people by id ("stop requested by 3f2a…"): by name here.
  const reason = str(d.reason)?.replace(/\b[0-9a-f]{32}\b/g, (id) => id === r.actor && r.actor_email ? r.actor_email : name(id))
  const because = reason ? ` (${reason})` : ''
  if (r.decision === 'deny') return `${who} tried to ${attempt(r.action)}: refused${r.reason ? ` (${r.reason})` : ''}.`
  switch (r.action) {
    case 'create_room': return `${who} created the room.`
    case 'create_invite': return `${who} made an invite link${str(d.role) ? ` for ${article(str(d.role)!)}` : ''}.`
    case 'revoke_invite': return `${who} revoked an invite link.`
    case 'accept_invite': return `${who} joined${str(d.role) ? ` as ${article(str(d.role)!)}` : ''} through an invite.`
    case 'change_participant': {
      const to = Array.isArray(d.to) ? d.to as Capability[] : []
      const role = roleOf(to)
      return role ? `${who} made ${target} ${article(role)}.` : `${who} changed ${target}'s rights: now can ${to.filter((c) => c !== 'observe').map(words).join(', ') || 'only watch'}.`
    }
    case 'remove_participant': return str(d.target) === r.actor ? `${who} left the room.` : `${who} removed ${target} from the room.`
    case 'sandbox_start': {
      const kept = str(d.resumed_from_kept)
      const from = kept ? ` from its kept ${kept}` : str(d.resumed_from) ? ' from its last snapshot' : ''
      return `The sandbox started${from}${because}.`
    }
    case 'sandbox_stop': return system ? `The sandbox stopped${because}.` : `${who} stopped the sandbox${because}.`
    case 'sandbox_failed': return `The sandbox failed${because}.`
    case 'decide_approval': return `${who} ${r.decision === 'approve' || d.approve === true ? 'approved' : 'refused'} a request.`
    case 'add_secret': return `${who} added a secret.`
    case 'remove_secret': return `${who} removed a secret.`
    case 'create_agent': return `${who} brought in ${str(d.name) ? `the agent ${str(d.name)}` : 'an agent'}${d.approval_mode === true ? ', each of its commands waiting for an approval' : ''}.`
    case 'revoke_agent': return `${who} ended ${str(d.name) ? `the agent ${str(d.name)}` : 'an agent'}.`
    case 'create_checkpoint': return `${who} saved a checkpoint.`
    case 'restore_checkpoint': return `${who} rolled the room back to a checkpoint.`
    case 'fork': return `${who} forked the room.`
    case 'run_command': {
      const what = d.terminal === true ? `${typeof d.commands === 'number' ? d.commands : 1} command(s) in the terminal` : (str(d.program) ?? 'a command')
      return r.decision === 'needs_approval' ? `${who} asked to run ${what}.` : `${who} ran ${what}.`
    }
    case 'set_readiness': return d.cleared === true ? `${who} cleared the readiness step.` : `${who} set the readiness step to run ${str(d.program) ?? 'a command'}.`
    case 'public_preview': return r.decision === 'needs_approval' ? `${who} asked for a public preview.` : `${who} opened a public preview.`
    case 'publish': return `${who} opened a preview for the room.`
    case 'export': {
      const params = d.params !== null && typeof d.params === 'object' ? d.params as Details : {}
      if (params.workspace === true) {
        const size = typeof d.bytes === 'number' ? ` (${bytesText(d.bytes)})` : ''
        return `${who} downloaded the workspace${size}.`
      }
      return `${who} exported files.`
    }
    case 'create_file': return `${who} created ${str(d.path) ?? 'a file'}.`
    case 'rename_file': return `${who} renamed ${str(d.path) ?? 'a file'} to ${str(d.to) ?? 'another name'}.`
    case 'move_file': return `${who} moved ${str(d.path) ?? 'a file'} to ${str(d.to) ?? 'another folder'}.`
    case 'delete_file': {
      const what = `${who} deleted ${str(d.path) ?? 'a file'}${typeof d.bytes === 'number' ? ` (${bytesText(d.bytes)})` : ''}`
      if (d.came_back === true) return `${what}; it came back at once with someone's typing in it.`
      return d.not_kept === true ? `${what}; its text was not kept.` : `${what}; it waits in the trash.`
    }
    case 'file_operations_unrecorded': return `${who} made ${typeof d.count === 'number' ? d.count : 'more'} more file operations at once: counted here, not listed one by one.`
    case 'restore_file': return `${who} restored ${str(d.path) ?? 'a file'} from the trash${str(d.deleted_path) && str(d.deleted_path) !== str(d.path) ? ` (deleted as ${str(d.deleted_path)})` : ''}.`
    case 'request_deletion': return `${who} asked for the room to be deleted.`
    case 'confirm_deletion': return `${who} confirmed the room's deletion.`
    case 'audit_anchor': return 'The server anchored the log\'s head.'
    case 'metered': return 'The server wrote down the room\'s metered use.'
    case 'restore_user': return `${who} restored ${str(d.email) ?? 'an account'}: it may log in again.`
    case 'revoke_user': return `${who} revoked ${str(d.email) ?? 'an account'} everywhere: removed from ${Array.isArray(d.rooms) ? d.rooms.length : 0} room(s), ${typeof d.sessions === 'number' ? d.sessions : 0} session(s) ended.`
    default: return `${who}: ${r.action.replace(/_/g, ' ')}${r.decision !== 'allow' && r.decision !== 'system' ? ` (${r.decision})` : ''}.`
  }
}

/** What the audit panel lists: records as they are, with each run of `metered` records
 *  folded into one line. */
export type AuditLine = { kind: 'record', record: AuditRecord } | { kind: 'metered', records: AuditRecord[] }

export function foldMetered (records: readonly AuditRecord[]): AuditLine[] {
  const out: AuditLine[] = []
  for (const r of records) {
    const last = out[out.length - 1]
    if (r.action === 'metered') {
      if (last?.kind === 'metered') last.records.push(r)
      else out.push({ kind: 'metered', records: [r] })
    } else {
      out.push({ kind: 'record', record: r })
    }
  }
  return out
}

/** A folded run of `metered` records, in a sentence. */
export function meteredSentence (records: readonly AuditRecord[], when: (ms: number) => string): string {
  if (records.length === 1) return 'The server wrote down the room\'s metered use.'
  const times = records.map((r) => r.at).sort((a, b) => a - b)
  return `The server wrote down the room's metered use ${records.length} times, ${when(times[0])} to ${when(times[times.length - 1])}.`
}

/** The records as JSON Lines (one record a line, as the server keeps them). */
export function jsonLines (records: readonly AuditRecord[]): string {
  return records.map((r) => JSON.stringify(r)).join('\n') + (records.length ? '\n' : '')
}
