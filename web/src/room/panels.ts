// The room's side panels besides People: approvals, sandbox, audit, and the room itself.

import { api, exportRepo, exportWorkspace, list, type Approval, type AuditRecord, type Room, type SandboxStatus } from '../api'
import { abilities } from '../caps'
import { action, confirmButton, h, replace, toast, when } from '../dom'
import { verifyChain } from '../audit'
import { approvalWords, whoIs } from '../notices'
import { actorText, auditSentence, foldMetered, jsonLines, meteredSentence, type AuditLine } from '../auditText'
import { limitRows, receiptRows, usageRows, vmSentence } from '../sandbox'
import { parentView, readinessView } from './checkpoints'

function emailOf (room: Room, id: string | null): string {
  if (!id) return '—'
  return room.participants.find((p) => p.user_id === id)?.email ?? id
}

/** Saves `data` as a JSON file through the browser's download. */
export function download (name: string, data: unknown): void {
  const blob = data instanceof Blob ? data : new Blob([JSON.stringify(data, null, 2)], { type: 'application/json' })
  const url = URL.createObjectURL(blob)
  const a = h('a', { href: url, download: name })
  document.body.append(a)
  a.click()
  a.remove()
  setTimeout(() => URL.revokeObjectURL(url), 10_000)
}

/** An approval's state, in words. */
const STATE_WORDS: Record<string, string> = {
  pending: 'waiting for a decision',
  approved: 'approved',
  used: 'approved and done',
  denied: 'refused',
  expired: 'expired undecided',
}

export async function approvalsPanel (el: HTMLElement, room: Room, selfId: string, refresh: () => void): Promise<void> {
  const items = list<Approval>(await api.approvals(room.id))
  const can = abilities(room.my_capabilities)
  const pending = items.filter((a) => a.state === 'pending')
  const ready = items.filter((a) => a.state === 'approved' && a.requester === selfId)
  const decided = items.filter((a) => a.state !== 'pending' && !ready.includes(a))
  const row = (a: Approval): HTMLElement => {
    const own = a.requester === selfId
    const files = (a.params as { files?: unknown } | null)?.files
    const fetchExport = a.action === 'export' && a.state === 'approved' && own && Array.isArray(files)
      ? action('Download the export', async () => {
        const out = await api.exportFiles(room.id, files as string[], a.id)
        download(`${room.name}-export.json`, out)
        refresh()
      }, { class: 'primary', 'data-testid': `download-${a.id}` })
      : null
    const params = (a.params ?? {}) as { rule?: string, repo?: string, message?: string, format?: string, workspace?: boolean }
    // Approved for me: the action it covers, one click away.
    const use = a.state === 'approved' && own
      ? a.action === 'export' && params.workspace === true
        ? action('Download the workspace', async () => {
          const out = await exportWorkspace(room.id, a.id)
          if (out instanceof Blob) download(`${room.name}.tar.gz`, out)
          refresh()
        }, { class: 'primary', 'data-testid': `use-${a.id}` })
        : a.action === 'allow_egress' && params.rule
        ? action(`Allow ${params.rule}`, async () => {
          await api.allowEgress(room.id, params.rule!, a.id)
          toast(`${params.rule} allowed.`)
          refresh()
        }, { class: 'primary', 'data-testid': `use-${a.id}` })
        : a.action === 'export' && params.repo && (params.format === 'bundle' || params.format === 'patch')
          ? action(`Download the ${params.format}`, async () => {
            const format = params.format as 'bundle' | 'patch'
            const out = await exportRepo(room.id, params.repo!, format, a.id)
            if (out instanceof Blob) download(`room-changes.${format}`, out)
            refresh()
          }, { class: 'primary', 'data-testid': `use-${a.id}` })
          : a.action === 'force_push' && params.repo && params.message
          ? action('Push now (forced)', async () => {
            await api.pushRepo(room.id, params.repo!, params.message!, true, a.id)
            toast('Pushed.')
            refresh()
          }, { class: 'primary', 'data-testid': `use-${a.id}` })
          : null
      : null
    const buttons = fetchExport ?? use ?? (a.state === 'pending' && can.approve
      ? own
        ? h('p', { class: 'hint' }, 'You asked for this: someone else must decide.')
        : h('div', { class: 'row' },
          action('Approve', async () => { await api.decide(room.id, a.id, true); toast('Approved'); refresh() }, { class: 'primary', 'data-testid': `approve-${a.id}` }),
          action('Deny', async () => { await api.decide(room.id, a.id, false); toast('Denied'); refresh() }, { class: 'danger' }))
      : null)
    const agents = room.agents ?? []
    const who = own ? 'You' : whoIs(a.requester, room.participants, agents)
    return h('li', { class: `approval ${a.state}`, 'data-testid': `approval-${a.id}` },
      h('div', null, h('strong', null, `${who} ${own ? 'ask' : 'asks'} to ${approvalWords(a.action, a.params)}`), ' — ',
        h('span', { class: 'state' }, STATE_WORDS[a.state] ?? a.state),
        a.decided_by ? ` by ${whoIs(a.decided_by, room.participants, agents)}` : ''),
      h('div', { class: 'hint' }, `asked ${when(a.created_at)}, expires ${when(a.expires_at)}`),
      h('p', { class: 'hint' }, 'Exactly these parameters (an approval covers nothing else):'),
      h('pre', { class: 'params' }, JSON.stringify(a.params, null, 2)),
      buttons)
  }
  replace(el,
    h('div', { class: 'panel-head' }, h('h2', null, 'Approvals'), action('Refresh', refresh)),
    pending.length ? h('ul', { class: 'approvals' }, pending.map(row)) : h('p', { class: 'hint' }, 'Nothing waits for a decision.'),
    ready.length ? [h('h3', null, 'Approved for you'), h('ul', { class: 'approvals' }, ready.map(row))] : null,
    decided.length ? h('details', null, h('summary', null, `Decided (${decided.length})`), h('ul', { class: 'approvals' }, decided.map(row))) : null)
}

/** Rows of [what, value] as a two-column table (a value's lines kept), or null for none. */
function rows (r: Array<[string, string]>, testid: string): HTMLElement | null {
  if (r.length === 0) return null
  return h('table', { class: 'kv', 'data-testid': testid }, h('tbody', null, r.map(([k, v]) =>
    h('tr', null, h('th', null, k), h('td', { class: 'pre-line' }, v)))))
}

export async function sandboxPanel (el: HTMLElement, room: Room, refresh: () => void): Promise<void> {
  let s: SandboxStatus
  try {
    s = await api.sandbox(room.id)
  } catch (e) {
    replace(el, h('h2', null, 'Sandbox'), h('p', { class: 'error' }, (e as Error).message))
    return
  }
  const can = abilities(room.my_capabilities)
  const running = s.state === 'running'
  const controls = can.type
    ? running
      ? action('Stop (snapshot the workspace)', async () => { await api.sandboxStop(room.id); refresh() })
      : action('Start', async () => { await api.sandboxStart(room.id); refresh() }, { class: 'primary' })
    : null
  replace(el,
    h('div', { class: 'panel-head' }, h('h2', null, 'Sandbox'), action('Refresh', refresh)),
    h('p', { 'data-testid': 'sandbox-summary' },
      h('strong', null, s.tier), ' tier — ', h('span', { class: `state ${s.state}` }, s.state),
      s.reason ? h('span', { class: 'hint' }, ` (${s.reason})`) : null),
    s.tier_reason ? h('p', { class: 'hint', 'data-testid': 'tier-reason' }, 'Why this tier: ', s.tier_reason) : null,
    vmView(s.receipt),
    s.resumed_from ? h('p', { 'data-testid': 'resumed' }, `Resumed: the workspace was restored from its snapshot of ${when(s.resumed_from)}.`) : null,
    h('p', { class: 'hint' }, `Last snapshot: ${when(s.snapshot_at)}. Stops when idle at: ${when(s.idle_stop_at)}.`),
    s.file_sync && s.file_sync.not_mirrored > 0
      ? h('p', { class: 'error', 'data-testid': 'sync-cap' },
        `${s.file_sync.not_mirrored} text files of the workspace are not in the editor: a room mirrors at most ${s.file_sync.cap} files. They stay in the workspace, untouched.`)
      : null,
    controls,
    h('h3', null, 'Readiness'), readinessView(s.readiness, room.readiness),
    h('h3', null, 'Limits'), rows(limitRows(s.limits), 'sandbox-limits') ?? h('p', { class: 'hint' }, '—'),
    h('h3', null, 'What it ran into'),
    rows(usageRows(s.usage), 'sandbox-usage') ?? h('p', { class: 'hint' }, '—'),
    h('p', { class: 'hint' }, 'Sandbox time, commands, network traffic and model tokens are in the Spend panel.'),
    s.receipt
      ? h('details', { 'data-testid': 'sandbox-receipt' }, h('summary', null, 'How it was started (details)'), rows(receiptRows(s.receipt), 'receipt-rows'))
      : h('p', { class: 'hint' }, 'Not started yet.'))
}

function vmView (receipt: Record<string, unknown> | null | undefined): HTMLElement | null {
  const text = vmSentence(receipt)
  return text == null ? null : h('p', { 'data-testid': 'sandbox-vm' }, text)
}

/** The audit panel's filters, kept while the page is open. */
const auditFilter = { who: '', what: '', since: 0 }

export async function auditPanel (el: HTMLElement, room: Room, refresh: () => void): Promise<void> {
  const records = await api.audit(room.id)
  const verdict = verifyChain(room.id, records)
  const indicator = verdict.ok
    ? h('p', { class: 'chain ok', 'data-testid': 'audit-chain' }, `✔ Chain verified in this browser: ${verdict.count} records, each hash checked`)
    : h('p', { class: 'chain broken', 'data-testid': 'audit-chain', role: 'alert' }, `✘ Chain broken at record #${verdict.seq}: ${verdict.problem}`)
  const nameOf = (id: string): string => room.agents?.find((a) => a.agent_id === id)?.name ?? emailOf(room, id)
  const agentOf = (id: string): string | null => {
    const a = room.agents?.find((x) => x.agent_id === id)
    return a ? `${a.name} (an agent brought in by ${a.sponsor_email || 'someone no longer here'})` : null
  }
  const who = (r: AuditRecord): string => actorText(r, nameOf, agentOf)
  // Filters: who acted, what kind of act, since when.
  const people = [...new Set(records.map(who))].sort()
  const acts = [...new Set(records.map((r) => r.action))].sort()
  const option = (value: string, label: string, chosen: string): HTMLElement =>
    h('option', { value, selected: value === chosen }, label)
  const whoSelect = h('select', { 'aria-label': 'Who', 'data-testid': 'audit-who' },
    option('', 'Anyone', auditFilter.who), people.map((p) => option(p, p, auditFilter.who))) as HTMLSelectElement
  const whatSelect = h('select', { 'aria-label': 'What', 'data-testid': 'audit-what' },
    option('', 'Anything', auditFilter.what), acts.map((a) => option(a, a.replace(/_/g, ' '), auditFilter.what))) as HTMLSelectElement
  const spans: [string, number][] = [['Any time', 0], ['The last hour', 3_600_000], ['The last day', 86_400_000], ['The last week', 7 * 86_400_000]]
  const whenSelect = h('select', { 'aria-label': 'When', 'data-testid': 'audit-when' },
    spans.map(([label, ms]) => option(String(ms), label, String(auditFilter.since)))) as HTMLSelectElement
  const list = h('div')
  const draw = (): void => {
    auditFilter.who = whoSelect.value
    auditFilter.what = whatSelect.value
    auditFilter.since = Number(whenSelect.value)
    const after = auditFilter.since ? Date.now() - auditFilter.since : 0
    const kept = records.filter((r) => (!auditFilter.who || who(r) === auditFilter.who) &&
      (!auditFilter.what || r.action === auditFilter.what) && r.at >= after)
    const shown = kept.slice(-500).reverse()
    const line = (l: AuditLine): HTMLElement => l.kind === 'metered'
      ? h('li', { class: 'audit-record metered', 'data-testid': 'audit-metered' },
        h('div', { class: 'audit-sentence' }, meteredSentence(l.records, when)),
        h('details', { class: 'audit-raw' }, h('summary', null, `Records #${l.records[l.records.length - 1].seq} to #${l.records[0].seq}`),
          l.records.map((r) => h('code', { class: 'details' }, `#${r.seq} ${r.details_json ?? JSON.stringify(r.details)}`))))
      : record(l.record)
    const record = (r: AuditRecord): HTMLElement => h('li', { class: `audit-record ${r.decision}`, 'data-testid': `audit-${r.seq}` },
      h('div', { class: 'audit-sentence' }, auditSentence(r, nameOf, agentOf)),
      h('div', { class: 'audit-head hint' },
        h('span', { class: 'seq' }, `#${r.seq}`), ' · ', when(r.at),
        r.decision === 'deny' ? h('span', { class: 'decision deny' }, 'refused') : null),
      h('details', { class: 'audit-raw' }, h('summary', null, 'Record'),
        h('div', null, h('strong', null, r.action), ' ', h('span', { class: `decision ${r.decision}` }, r.decision), ' · ', who(r), ' · ', h('code', null, r.actor)),
        r.reason ? h('div', { class: 'reason' }, r.reason) : null,
        h('code', { class: 'details' }, r.details_json ?? JSON.stringify(r.details))))
    replace(list,
      kept.length > shown.length ? h('p', { class: 'hint' }, `Showing the latest ${shown.length} of ${kept.length}.`) : null,
      kept.length < records.length ? h('p', { class: 'hint', 'data-testid': 'audit-filtered' }, `${kept.length} of ${records.length} records match.`) : null,
      h('ol', { class: 'audit', reversed: true }, foldMetered(shown).map(line)))
  }
  for (const s of [whoSelect, whatSelect, whenSelect]) s.addEventListener('change', draw)
  const exportAll = action('Download as JSON Lines', () => {
    download(`${room.name}-audit.jsonl`, new Blob([jsonLines(records)], { type: 'application/jsonl' }))
  }, { 'data-testid': 'audit-export' })
  replace(el,
    h('div', { class: 'panel-head' }, h('h2', null, 'Audit log'), action('Refresh', refresh)),
    indicator,
    h('div', { class: 'row audit-filters' }, whoSelect, whatSelect, whenSelect, exportAll),
    list)
  draw()
}

export function roomPanel (el: HTMLElement, room: Room, paths: () => string[]): void {
  const can = abilities(room.my_capabilities)
  const out = h('div', { class: 'stack' })
  const exported = h('p', { class: 'hint', 'data-testid': 'export-state' })
  replace(el,
    h('h2', null, 'Room'),
    h('p', null, 'Name: ', h('strong', null, room.name)),
    h('p', null, 'Your capabilities: ', room.my_capabilities.join(', ')),
    room.parent ? parentView(room.parent) : null,
    h('p', { class: 'hint' }, 'Terminal recording: ',
      h('a', { href: `/api/rooms/${room.id}/terminal/recording`, download: `${room.name}.cast` }, 'asciicast'), ' · ',
      h('a', { href: `/api/rooms/${room.id}/terminal/recording/inputs` }, 'who typed what')),
    room.my_capabilities.includes('export')
      ? h('div', { class: 'stack' },
        h('h3', null, 'Export'),
        h('p', { class: 'hint' }, 'Someone else who holds approve must agree to each export first.'),
        h('div', { class: 'row' },
          action('Export all files…', async () => {
            const files = paths()
            if (files.length === 0) { exported.textContent = 'There are no files to export.'; return }
            const r = await api.exportFiles(room.id, files.slice(0, 100))
            exported.textContent = r.state === 'pending_approval'
              ? 'Waiting for approval. Once approved, download it from the Approvals panel.'
              : 'Exported.'
          }, { 'data-testid': 'export' }),
          action('Download the workspace…', async () => {
            const r = await exportWorkspace(room.id)
            exported.textContent = r instanceof Blob
              ? 'Downloaded.'
              : 'Waiting for approval. Once approved, download the archive from the Approvals panel.'
            if (r instanceof Blob) download(`${room.name}.tar.gz`, r)
          }, { 'data-testid': 'export-workspace' })),
        h('p', { class: 'hint' }, 'The workspace downloads as a .tar.gz: every file, build output and binaries included, with the texts as the editor shows them.'),
        exported)
      : null,
    can.delete
      ? h('div', { class: 'danger-zone stack' },
        h('h3', null, 'Delete this room'),
        h('p', { class: 'hint' }, 'A system admin must confirm. Then everything is destroyed and you get a receipt.'),
        confirmButton('Ask to delete this room', 'Click again: ask an admin to delete this room and all in it', async () => {
          const d = await api.requestDeletion(room.id)
          const link = `${location.origin}/deletions/${d.deletion_id}`
          replace(out, h('p', { 'data-testid': 'deletion-requested' }, 'Deletion requested (', d.state, '). Send this link to a system admin: ',
            h('a', { href: `/deletions/${d.deletion_id}` }, link)))
        }, { class: 'danger', 'data-testid': 'request-deletion' }),
        out)
      : null)
}
