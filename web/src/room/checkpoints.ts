// The Checkpoints panel: the room's readiness (its command and where it is), checkpoints to make,
// restore and fork from, and where a fork came from.

import { api, list, type Approval, type Checkpoint, type Readiness, type Room } from '../api'
import { abilities } from '../caps'
import { action, confirmButton, h, replace, toast, when } from '../dom'

/** How long a Restore button waits for its second click. */
const CONFIRM_MS = 4000

function size (bytes: number): string {
  if (bytes < 1024) return `${bytes} B`
  if (bytes < 1 << 20) return `${(bytes / 1024).toFixed(1)} KiB`
  return `${(bytes / (1 << 20)).toFixed(1)} MiB`
}

/** One line saying where the readiness step is (with the output of a failure). */
export function readinessView (r: Readiness | undefined, command: string | null | undefined): HTMLElement {
  const box = h('div', { class: 'readiness', 'data-testid': 'readiness' })
  // Those who may not run commands are not told the command (nor its output), only the state.
  if (!command && (!r || r.state === 'none')) {
    replace(box, h('p', { class: 'hint' }, 'No readiness step that you can see: the room is ready once its sandbox runs.'))
    return box
  }
  switch (r?.state) {
    case 'preparing':
      replace(box, h('p', { class: 'state preparing' }, `Preparing… (running since ${when(r.since)})`))
      break
    case 'ready':
      replace(box, h('p', { class: 'state ready' }, r.skipped
        ? `Ready (the workspace was saved after the step had run; not run again, ${when(r.at)})`
        : `Ready (the step completed ${when(r.at)})`))
      break
    case 'failed':
      replace(box,
        h('p', { class: 'error', role: 'alert' }, r.timed_out
          ? 'Not ready: the readiness step timed out. The room works; fix the step or run it by hand.'
          : `Not ready: the readiness step exited with ${r.exit_code ?? 'no code'}. The room works; fix the step or run it by hand.`),
        r.output ? h('pre', { class: 'params', 'data-testid': 'readiness-output' }, r.output) : null)
      break
    default:
      replace(box, h('p', { class: 'hint' }, 'Runs when the sandbox next starts.'))
  }
  return box
}

export async function checkpointsPanel (el: HTMLElement, room: Room, selfId: string, go: (path: string) => void, refresh: () => void): Promise<void> {
  const [items, status] = await Promise.all([api.checkpoints(room.id), api.sandbox(room.id).catch(() => null)])
  const can = abilities(room.my_capabilities)
  const by = (id: string): string => id === selfId ? 'you' : room.participants.find((p) => p.user_id === id)?.email ?? id

  // Readiness: the command, and where it is.
  const command = h('input', {
    type: 'text', class: 'grow', value: room.readiness ?? '', placeholder: 'e.g. npm ci',
    'aria-label': 'Readiness command', 'data-testid': 'readiness-command', maxlength: 4096,
  })
  const readiness = h('section', { class: 'stack' },
    h('h3', null, 'Ready means ready'),
    h('p', { class: 'hint' }, 'A command run in the sandbox after every start, before the room counts as ready (installing dependencies, say). The room works meanwhile.'),
    readinessView(status?.readiness, room.readiness),
    can.type
      ? h('div', { class: 'row' }, command, action('Save', async () => {
        const v = command.value.trim()
        await api.setReadiness(room.id, v === '' ? null : v)
        toast(v === '' ? 'No readiness step.' : 'Saved: it runs when the sandbox next starts.')
        refresh()
      }, { 'data-testid': 'readiness-save' }))
      : null)

  // Making one.
  const name = h('input', { type: 'text', class: 'grow', placeholder: 'Name, e.g. before the upgrade', 'aria-label': 'Checkpoint name', 'data-testid': 'checkpoint-name', maxlength: 100 })
  const makeButton = action('Checkpoint now', async () => {
    const n = name.value.trim() || `checkpoint ${new Date().toLocaleString()}`
    const c = await api.checkpoint(room.id, n)
    toast(`Checkpoint "${c.name}" made (${size(c.bytes)}).`)
    refresh()
  }, { class: 'primary', 'data-testid': 'checkpoint-make' })
  const make = can.edit
    ? h('form', { class: 'row', onsubmit: (e: Event) => { e.preventDefault(); makeButton.click() } }, name, makeButton)
    : null

  /** An approval someone gave this person for `action` on checkpoint `id`, not yet used. */
  const approvedFor = async (action: string, id: string): Promise<Approval | undefined> =>
    list<Approval>(await api.approvals(room.id)).find((a) =>
      a.action === action && a.state === 'approved' && a.requester === selfId &&
      (a.params as { checkpoint?: string } | null)?.checkpoint === id)

  const armed = new Map<string, number>()
  const row = (c: Checkpoint): HTMLElement => {
    const restore = can.edit
      ? action('Restore', async () => {
        const at = armed.get(c.id) ?? 0
        if (Date.now() > at) {
          armed.set(c.id, Date.now() + CONFIRM_MS)
          restoreButton.textContent = 'Restore: click again to confirm'
          setTimeout(() => { if (restoreButton.isConnected) restoreButton.textContent = 'Restore' }, CONFIRM_MS)
          return
        }
        armed.delete(c.id)
        // An approval someone gave for this restore, if the room asks for one.
        const approved = await approvedFor('restore_checkpoint', c.id)
        const r = await api.restore(room.id, c.id, approved?.id)
        if (r?.state === 'pending_approval') {
          toast('This room asks for an approval before a restore: someone who holds approve must agree (Approvals panel), then restore again.')
          return
        }
        toast(`Restored "${c.name}": everyone's files now read as they did then.`)
        refresh()
      }, { 'data-testid': `restore-${c.id}`, title: 'Files and workspace go back to this checkpoint, for everyone in the room' })
      : null
    const restoreButton = restore as HTMLButtonElement
    // With `export` a fork is made at once; without it, it waits for someone else's approval.
    const fork = confirmButton('Fork', 'Fork: click again', async () => {
      const approved = can.export
        ? undefined
        : await approvedFor('fork', c.id)
      const f = await api.fork(room.id, c.id, approved?.id)
      if (f.state === 'pending_approval' || !f.id) {
        toast('Forking needs export, or someone else\'s approval: asked (Approvals panel). Fork again once approved.')
        return
      }
      toast(`Forked into "${f.name ?? 'a new room'}".`)
      go(`/rooms/${f.id}`)
    }, { 'data-testid': `fork-${c.id}`, title: 'A new room of your own with these files, and none of this room\'s people or grants' })
    return h('li', { class: 'checkpoint', 'data-testid': 'checkpoint' },
      h('div', null, h('strong', null, c.name), ' ', h('span', { class: 'hint' }, `${when(c.at)} · by ${c.scheduled ? 'the schedule' : by(c.author)} · ${size(c.bytes)}`)),
      h('div', { class: 'row' }, restore, fork))
  }

  // The room's checkpoint policy.
  const p = room.checkpoint_policy
  const every = h('input', { type: 'number', min: 5, max: 10080, value: p?.every_s ? Math.round(p.every_s / 60) : '', placeholder: 'off', 'aria-label': 'Checkpoint every (minutes)', 'data-testid': 'policy-every', class: 'short' })
  const keep = h('input', { type: 'number', min: 1, max: 365, value: p?.keep_days ?? '', placeholder: 'no limit', 'aria-label': 'Keep for (days)', 'data-testid': 'policy-keep', class: 'short' })
  const needsApproval = h('input', { type: 'checkbox', 'data-testid': 'policy-approval', checked: p?.restore_needs_approval ?? false })
  const policy = h('details', { class: 'stack' },
    h('summary', null, 'Policy: ', p?.every_s ? `every ${Math.round(p.every_s / 60)} min` : 'no schedule',
      p?.keep_days ? `, kept ${p.keep_days} days` : '', p?.restore_needs_approval ? ', restores need an approval' : ''),
    can.approve
      ? h('div', { class: 'stack' },
        h('label', { class: 'row' }, 'Checkpoint every', every, 'minutes'),
        h('label', { class: 'row' }, 'Keep checkpoints for', keep, 'days'),
        h('label', { class: 'row' }, needsApproval, 'A restore needs someone else\'s approval'),
        action('Save the policy', async () => {
          const minutes = every.value === '' ? null : Number(every.value)
          const days = keep.value === '' ? null : Number(keep.value)
          await api.setCheckpointPolicy(room.id, { every_s: minutes === null ? null : minutes * 60, keep_days: days, restore_needs_approval: needsApproval.checked })
          toast('Checkpoint policy saved.')
          refresh()
        }, { 'data-testid': 'policy-save' }))
      : null)

  const parent = room.parent
  replace(el,
    h('div', { class: 'panel-head' }, h('h2', null, 'Checkpoints'), action('Refresh', refresh)),
    parent ? parentView(parent) : null,
    readiness,
    h('h3', null, 'Checkpoints'),
    h('p', { class: 'hint' }, 'A checkpoint keeps every file of the room and its workspace. Restoring one changes the files for everyone, live; a fork makes a room of your own from it, with none of this room\'s people, grants or approvals.'),
    make,
    policy,
    items.length
      ? h('ol', { class: 'checkpoints', reversed: true }, items.slice().reverse().map(row))
      : h('p', { class: 'hint' }, 'No checkpoints yet.'))
}

/** Where a fork came from. */
export function parentView (p: NonNullable<Room['parent']>): HTMLElement {
  const dropped = Object.entries(p.dropped ?? {}).filter(([, n]) => n > 0).map(([k, n]) => `${n} ${k}`)
  return h('div', { class: 'parentage', 'data-testid': 'parentage' },
    h('p', null, 'Forked from ', h('a', { href: `/rooms/${p.room}` }, `room ${p.room.slice(0, 8)}`),
      ` at checkpoint ${p.checkpoint.slice(0, 8)}.`),
    h('p', { class: 'hint' }, `The parent's audit chain head then: ${p.chain_head.slice(0, 16)}…`,
      dropped.length ? ` Not taken from it: ${dropped.join(', ')}.` : ' Nothing of its authority was taken.'))
}
