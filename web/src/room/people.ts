// The people panel: who is in the room, what they may do, who is online and typing; and the
// controls to invite, change roles, grant, revoke and remove (shown only to those allowed).

import { api, ApiError, CAPABILITIES, type AgentInfo, type Capability, type Room } from '../api'
import { abilities, canRemove, ROLES, settableRoles } from '../caps'
import { capsInWords, roleLine, words } from '../notices'
import { action, confirmButton, confirmChoice, copy, h, replace, toast } from '../dom'

export interface PeopleState {
  room: Room
  selfId: string
  online: Set<string>
  /** user id -> when they last typed in the terminal (ms). */
  typing: Map<string, number>
  /** user id -> until when its Remove button asks for confirmation (ms). Kept outside the
   *  panel, so a redraw (someone comes online, types, a poll) does not disarm it. */
  armed: Map<string, number>
  /** user ids whose rights are shown in detail (kept across redraws, like `armed`). */
  detailed: Set<string>
}

const CONFIRM_MS = 5000

const TYPING_SHOWN_MS = 2500

export function peoplePanel (el: HTMLElement, s: PeopleState, changed: () => Promise<void>): void {
  const mine = s.room.my_capabilities
  const can = abilities(mine)
  const now = Date.now()
  const rows = s.room.participants.map((p) => {
    const online = s.online.has(p.user_id)
    const typing = (s.typing.get(p.user_id) ?? 0) > now - TYPING_SHOWN_MS
    const roles = settableRoles(mine, p, s.selfId, p.user_id)
    const roleSelect = roles.length
      ? h('select', { 'aria-label': `New role for ${p.email}`, 'data-testid': `role-${p.email}` },
        h('option', { value: '' }, 'Change role…'), roles.map((r) => h('option', { value: r }, r)))
      : null
    // Authority changes ask once, in words, before they happen.
    const role = roleSelect
      ? confirmChoice(roleSelect as HTMLSelectElement, (r) => `Make ${p.email} ${r === 'owner' ? 'an owner' : `a ${r}`}`, async (r) => {
        try {
          await api.changeParticipant(s.room.id, p.user_id, { role: r })
          toast(`${p.email} is now ${r === 'owner' ? 'an owner' : `a ${r}`}`)
          await changed()
        } catch (e) { toast((e as Error).message, 'error') }
      })
      : null
    const grantable = can.grantable.filter((c) => !p.capabilities.includes(c))
    const grantSelect = grantable.length && p.user_id !== s.selfId
      ? h('select', { 'aria-label': `Grant a capability to ${p.email}`, 'data-testid': `grant-${p.email}` },
        h('option', { value: '' }, 'Grant…'), grantable.map((c) => h('option', { value: c }, c)))
      : null
    const grant = grantSelect
      ? confirmChoice(grantSelect as HTMLSelectElement, (c) => `Let ${p.email} ${words(c as Capability)}`, async (c) => {
        try {
          await api.changeParticipant(s.room.id, p.user_id, { grant: [c as Capability] })
          await changed()
        } catch (e) { toast((e as Error).message, 'error') }
      })
      : null
    const chips = CAPABILITIES.filter((c) => p.capabilities.includes(c)).map((c) =>
      h('span', { class: 'chip' }, c,
        can.revoke && p.user_id !== s.selfId
          ? confirmButton('×', `Take "${c}" from ${p.email}?`, async () => {
            await api.changeParticipant(s.room.id, p.user_id, { revoke: [c] })
            await changed()
          }, { class: 'chip-x', title: `Revoke ${c} from ${p.email}`, 'aria-label': `Revoke ${c} from ${p.email}` })
          : null))
    const armed = (): boolean => (s.armed.get(p.user_id) ?? 0) > Date.now()
    const remove = canRemove(mine, s.selfId, p.user_id)
      ? action(armed() ? 'Confirm removal' : 'Remove', async () => {
        if (!armed()) {
          s.armed.set(p.user_id, Date.now() + CONFIRM_MS)
          remove!.textContent = 'Confirm removal'
          disarmLater(remove!)
          return
        }
        s.armed.delete(p.user_id)
        await api.removeParticipant(s.room.id, p.user_id)
        toast(`${p.email} was removed`)
        await changed()
      }, { class: 'danger small', 'data-testid': `remove-${p.email}` })
      : null
    // Back to "Remove" once the confirmation lapses (also for a button drawn while armed).
    function disarmLater (button: HTMLButtonElement): void {
      const left = (s.armed.get(p.user_id) ?? 0) - Date.now()
      setTimeout(() => { if (!armed()) button.textContent = 'Remove' }, left + 50)
    }
    if (remove && armed()) disarmLater(remove)
    return h('li', { class: 'person', 'data-testid': `person-${p.email}` },
      h('div', { class: 'person-head' },
        h('span', { class: `dot ${online ? 'on' : 'off'}`, role: 'img', title: online ? 'online' : 'offline', 'aria-label': online ? 'online' : 'offline' }),
        h('strong', { 'data-testid': `name-${p.email}` }, p.display_name ?? p.email),
        p.display_name ? h('span', { class: 'hint' }, ` ${p.email}`) : null,
        p.user_id === s.selfId ? h('span', { class: 'hint' }, ' (you)') : null,
        h('span', { class: 'role', 'data-testid': `role-label-${p.email}` }, p.role),
        typing ? h('span', { class: 'typing' }, 'typing in the terminal…') : null),
      h('p', { class: 'meaning', 'data-testid': `meaning-${p.email}` }, roleLine(p.role, p.capabilities)),
      rightsDetails(s.detailed, p.user_id, chips),
      role || grant || remove ? h('div', { class: 'row' }, role, grant, remove) : null)
  })
  const agents = (s.room.agents ?? []).map((a) => agentRow(a, s, changed))
  // An open invite or agent form (and the link or token it made) survives redraws.
  const keep = can.invite ? el.querySelector('.invite') : null
  const keepAgent = can.invite ? el.querySelector('.agent-form') : null
  const head = h('div', { class: 'panel-head' }, h('h2', null, 'People'), can.invite ? inviteButton(el, s) : null)
  const token = (keep as HTMLElement | null)?.dataset.token
  if (keep && token) {
    // The link made here: once used up, expired or revoked, it leaves the panel.
    api.showInvite(token).catch((e: unknown) => {
      if (!(e instanceof ApiError) || e.status !== 410 || !keep.isConnected) return
      delete (keep as HTMLElement).dataset.token
      keep.querySelector('.stack:last-child')?.replaceChildren(
        h('p', { class: 'hint', 'data-testid': 'invite-gone' }, `That link no longer works (${e.message.replace(/\.$/, '')}).`))
    })
  }
  replace(el, head, keep, h('ul', { class: 'people' }, rows),
    h('div', { class: 'panel-head' }, h('h3', null, 'Agents'), can.invite ? agentButton(el, s, changed) : null),
    keepAgent,
    agents.length ? h('ul', { class: 'people' }, agents) : h('p', { class: 'hint' }, 'No agents. An agent works here through MCP, with no more rights than whoever brings it in.'),
    moderation(s, changed))
}

/** A participant's capabilities, on demand; open stays open across redraws. */
function rightsDetails (detailed: Set<string>, userId: string, chips: HTMLElement[]): HTMLElement {
  const d = h('details', { class: 'rights', open: detailed.has(userId) },
    h('summary', null, 'Rights in detail'), h('div', { class: 'chips' }, chips))
  d.addEventListener('toggle', () => { if (d.open) detailed.add(userId); else detailed.delete(userId) })
  return d
}

/** The room's moderation: agents type in the terminal only while an approver is here. */
function moderation (s: PeopleState, changed: () => Promise<void>): HTMLElement {
  const on = s.room.moderated ?? false
  if (!abilities(s.room.my_capabilities).approve) {
    return h('p', { class: 'hint', 'data-testid': 'moderated' }, on
      ? 'Moderated: agents type in the terminal only while someone who can approve is here.'
      : 'Agents with type may use the terminal whoever is here.')
  }
  const box = h('input', { type: 'checkbox', checked: on, 'data-testid': 'moderated' })
  box.addEventListener('change', () => {
    api.setModerated(s.room.id, box.checked)
      .then(async () => {
        toast(box.checked ? 'Agents now type in the terminal only while someone who can approve is here.' : 'Agents no longer need an approver present to type.')
        await changed()
      })
      .catch((e: unknown) => { box.checked = !box.checked; toast(String(e), 'error') })
  })
  return h('label', { class: 'row' }, box, 'Moderated: agents type in the terminal only while someone who can approve is here')
}

function agentRow (a: AgentInfo, s: PeopleState, changed: () => Promise<void>): HTMLElement {
  const online = s.online.has(a.agent_id)
  const mayEnd = a.sponsor === s.selfId || abilities(s.room.my_capabilities).revoke
  return h('li', { class: 'person agent', 'data-testid': `agent-${a.name}` },
    h('div', { class: 'person-head' },
      h('span', { class: `dot ${online ? 'on' : 'off'}`, role: 'img', title: online ? 'working in the room' : 'idle', 'aria-label': online ? 'working in the room' : 'idle' }),
      h('strong', null, a.name), h('span', { class: 'role' }, 'agent'),
      online ? h('span', { class: 'typing' }, 'editing…') : null),
    h('div', { class: 'hint' }, `brought in by ${a.sponsor_email || 'someone no longer here'}${a.approval_mode ? '; each command it runs waits for an approval' : ''}`),
    h('div', { class: 'chips' }, a.capabilities.map((c) => h('span', { class: 'chip' }, c))),
    mayEnd
      ? h('div', { class: 'row' }, confirmButton('End', `End ${a.name}: click again`, async () => {
        await api.revokeAgent(s.room.id, a.agent_id)
        toast(`${a.name} is gone from the room: everything it ran stopped`)
        await changed()
      }, { class: 'danger small', 'data-testid': `agent-end-${a.name}` }))
      : null)
}

function agentButton (panel: HTMLElement, s: PeopleState, changed: () => Promise<void>): HTMLElement {
  return action('Add an agent…', () => {
    panel.querySelector('.agent-form')?.remove()
    const form = agentForm(s, changed)
    const heads = panel.querySelectorAll('.panel-head')
    heads[heads.length - 1]?.after(form)
    ;(form.querySelector('input') as HTMLInputElement | null)?.focus()
  }, { 'data-testid': 'agent-open' })
}

function agentForm (s: PeopleState, changed: () => Promise<void>): HTMLElement {
  const mine = s.room.my_capabilities
  const name = h('input', { 'aria-label': 'Agent name', placeholder: 'e.g. test-writer', maxlength: 64, 'data-testid': 'agent-name' })
  const boxes = CAPABILITIES.filter((c) => mine.includes(c)).map((c) => {
    const box = h('input', { type: 'checkbox', value: c, checked: c === 'observe' || c === 'edit', disabled: c === 'observe', 'data-testid': `agent-cap-${c}` })
    return h('label', { class: 'row' }, box, c)
  })
  const ttl = h('select', { 'aria-label': 'For how long' },
    h('option', { value: 3600 }, '1 hour'), h('option', { value: 8 * 3600, selected: true }, '8 hours'), h('option', { value: 7 * 86400 }, '7 days'))
  const careful = h('input', { type: 'checkbox', 'data-testid': 'agent-approval-mode' })
  const out = h('div', { class: 'stack' })
  const form = h('form', { class: 'agent-form invite stack' },
    name, h('div', { class: 'chips' }, boxes),
    h('label', { class: 'row' }, careful, 'Each command it runs waits for an approval'),
    h('label', null, 'For ', ttl),
    h('button', { type: 'submit', class: 'primary', 'data-testid': 'agent-create' }, 'Add the agent'),
    out)
  form.addEventListener('submit', async (e) => {
    e.preventDefault()
    const caps = boxes.map((b) => b.querySelector('input')!).filter((b) => b.checked).map((b) => b.value as Capability)
    try {
      const a = await api.createAgent(s.room.id, { name: name.value.trim(), capabilities: caps, ttl_s: Number(ttl.value), approval_mode: careful.checked })
      const endpoint = `${location.origin}/api/rooms/${s.room.id}/mcp`
      const token = h('input', { readonly: true, value: a.token, 'aria-label': 'Agent token', 'data-testid': 'agent-token' })
      replace(out,
        h('p', { class: 'hint' }, `Give your agent this MCP endpoint and token (shown once). It holds ${a.capabilities.join(', ')}, never more than you.`),
        h('code', { class: 'url', 'data-testid': 'agent-endpoint' }, endpoint),
        h('div', { class: 'row' }, token,
          action('Copy', async () => { toast(await copy(a.token, token) ? 'Token copied' : 'Select the token and copy it') })))
      token.select()
      await changed()
    } catch (err) {
      toast((err as Error).message, 'error')
    }
  })
  return form
}

function inviteButton (panel: HTMLElement, s: PeopleState): HTMLElement {
  return action('Invite…', () => {
    panel.querySelector('.invite')?.remove()
    panel.querySelector('.panel-head')?.after(inviteForm(s))
    ;(panel.querySelector('.invite select') as HTMLSelectElement | null)?.focus()
  }, { 'data-testid': 'invite-open' })
}

function inviteForm (s: PeopleState): HTMLElement {
  const mine = s.room.my_capabilities
  const roles = abilities(mine).inviteRoles
  const role = h('select', { 'aria-label': 'Role', 'data-testid': 'invite-role' },
    roles.map((r) => h('option', { value: r, selected: r === 'editor' }, r))) as HTMLSelectElement
  const ttl = h('select', { 'aria-label': 'Valid for' },
    h('option', { value: 3600 }, '1 hour'), h('option', { value: 86400, selected: true }, '1 day'), h('option', { value: 7 * 86400 }, '7 days'))
  const uses = h('select', { 'aria-label': 'Uses' },
    h('option', { value: 1, selected: true }, 'one use'), h('option', { value: 5 }, '5 uses'), h('option', { value: 25 }, '25 uses')) as HTMLSelectElement
  // What the invite grants: the role's, or chosen (only what the inviter holds; observe always).
  const boxes = CAPABILITIES.filter((c) => mine.includes(c)).map((c) =>
    h('input', { type: 'checkbox', value: c, disabled: c === 'observe', 'data-testid': `invite-cap-${c}` }) as HTMLInputElement)
  const fromRole = (): void => {
    const preset = ROLES[role.value] ?? ['observe']
    for (const b of boxes) b.checked = preset.includes(b.value as Capability)
  }
  fromRole()
  role.addEventListener('change', fromRole)
  const email = h('input', { type: 'email', placeholder: 'name@example.com (optional)', 'aria-label': 'Send to (email)', 'data-testid': 'invite-email', autocomplete: 'off' }) as HTMLInputElement
  // An invite sent to one address is for that one person.
  email.addEventListener('input', () => {
    uses.disabled = email.value.trim() !== ''
    if (uses.disabled) uses.value = '1'
  })
  const out = h('div', { class: 'stack' })
  const form = h('form', { class: 'invite stack' },
    h('div', { class: 'row' }, h('label', null, 'Role ', role), h('label', null, 'Valid for ', ttl), h('label', null, 'Uses ', uses)),
    h('fieldset', { class: 'chips' }, h('legend', null, 'It lets them'), boxes.map((b) => h('label', { class: 'row' }, b, b.value.replace(/_/g, ' ')))),
    h('label', null, 'Send to ', email),
    h('button', { type: 'submit', class: 'primary', 'data-testid': 'invite-create' }, 'Create invite'),
    out)
  form.addEventListener('submit', async (e) => {
    e.preventDefault()
    const chosen = boxes.filter((b) => b.checked).map((b) => b.value as Capability)
    const preset = ROLES[role.value] ?? []
    const same = chosen.length === preset.length && chosen.every((c) => preset.includes(c))
    const to = email.value.trim()
    try {
      const inv = await api.invite(s.room.id, role.value, Number(ttl.value), Number(uses.value),
        { ...(same ? {} : { capabilities: chosen }), ...(to ? { email: to } : {}) })
      // Looked at again whenever the panel is redrawn: a used-up link is taken away.
      form.dataset.token = inv.token
      const link = h('input', { readonly: true, value: inv.url, 'aria-label': 'Invite link', 'data-testid': 'invite-url' })
      const what = capsInWords(chosen)
      replace(out,
        h('div', { class: 'row' }, link,
          action('Copy', async () => { toast(await copy(inv.url, link) ? 'Link copied' : 'Select the link and copy it') }),
          action('Revoke link', async () => {
            await api.revokeInvite(inv.token)
            replace(out, h('p', { class: 'hint' }, 'Link revoked: it no longer works.'))
          }, { class: 'danger small' })),
        h('p', { class: 'hint', 'data-testid': 'invite-said' }, inv.sent_to
          ? `Sent to ${inv.sent_to}: only that account can join with it, once, to ${what}.`
          : `Anyone with this link can join to ${what} until it expires or is used up.`))
      link.select()
    } catch (err) {
      toast((err as Error).message, 'error')
    }
  })
  return form
}

