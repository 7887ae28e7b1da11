// The Network panel: what the room's sandbox may reach through the egress proxy (its allowlist
// and package-registry presets), the latest refused connections, and the counters. Owners (who
// hold approve) change the list; editors ask for a host, and someone who holds approve agrees in
// the Approvals panel.

import { api, list, type Approval, type Room } from '../api'
import { abilities } from '../caps'
import { action, h, replace, toast, when } from '../dom'

export async function networkPanel (el: HTMLElement, room: Room, selfId: string, refresh: () => void): Promise<void> {
  const eg = await api.egress(room.id)
  const can = abilities(room.my_capabilities)
  const save = async (allow: string[], presets: string[], said: string): Promise<void> => {
    await api.setEgress(room.id, { allow, presets })
    toast(said)
    refresh()
  }
  // Adds one rule: at once for approvers; an editor's ask waits for an approval, and an
  // approval already given to them for that rule is used.
  const allowOne = async (rule: string): Promise<void> => {
    const mine = list<Approval>(await api.approvals(room.id)).find((a) =>
      a.action === 'allow_egress' && a.state === 'approved' && a.requester === selfId &&
      (a.params as { rule?: string } | null)?.rule === rule)
    const r = await api.allowEgress(room.id, rule, can.approve ? undefined : mine?.id)
    toast(r.state === 'pending_approval'
      ? `Asked to allow ${rule}: someone who holds approve decides in the Approvals panel.`
      : `${rule} allowed.`)
    refresh()
  }
  const asks = can.approve ? 'Allow' : 'Ask to allow'

  const rule = h('input', { type: 'text', placeholder: 'api.example.com, *.example.org, host:8443', 'aria-label': 'Host to allow', 'data-testid': 'egress-rule', maxlength: 260 })
  const add = can.approve || can.edit
    ? h('div', { class: 'row' }, rule, action(asks, async () => {
      const v = rule.value.trim().toLowerCase()
      if (v) await allowOne(v)
    }, { class: 'primary', 'data-testid': 'egress-add' }))
    : h('p', { class: 'hint' }, 'Opening the network needs approve, or edit and someone\'s approval.')

  const allowList = eg.allow.length
    ? h('ul', { class: 'approvals' }, eg.allow.map((r) => h('li', { class: 'approval', 'data-testid': 'egress-allowed' },
      h('code', null, r),
      can.approve ? action('Remove', () => save(eg.allow.filter((x) => x !== r), eg.presets, `${r} removed.`), { class: 'danger', 'data-testid': `egress-remove-${r}` }) : null)))
    : h('p', { class: 'hint' }, 'Nothing is allowed: code in the sandbox cannot reach the network.')

  const presets = h('ul', { class: 'approvals' }, eg.available_presets.map((p) => {
    const on = eg.presets.includes(p.name)
    const box = h('input', { type: 'checkbox', checked: on, disabled: !can.approve, 'data-testid': `egress-preset-${p.name}`, 'aria-label': p.label })
    box.addEventListener('change', () => {
      const next = box.checked ? [...eg.presets, p.name] : eg.presets.filter((x) => x !== p.name)
      save(eg.allow, next, `${p.label} ${box.checked ? 'allowed' : 'no longer allowed'}.`)
        .catch((e: unknown) => { box.checked = on; toast(String(e), 'error') })
    })
    return h('li', { class: 'approval' }, h('label', { class: 'row' }, box, p.label), h('div', { class: 'hint' }, p.hosts.join(', ')))
  }))

  const denied = eg.recent_denied.length
    ? h('ul', { class: 'approvals' }, eg.recent_denied.map((d) => {
      const target = d.port === 80 || d.port === 443 ? d.host : `${d.host}:${d.port}`
      return h('li', { class: 'approval', 'data-testid': 'egress-denied' },
        h('div', null, h('code', null, `${d.host}:${d.port}`), ' · ', when(d.at)),
        h('div', { class: 'hint' }, d.reason),
        // Only a host the list could open gets the button: addresses inside never open.
        (can.approve || can.edit) && d.reason.includes('not on the room')
          ? action(`${asks} ${target}`, () => allowOne(target), { 'data-testid': `egress-allow-${target}` })
          : null)
    }))
    : h('p', { class: 'hint' }, 'No refused connections since the server started.')

  const name = (who: string): string => room.participants.find((p) => p.user_id === who)?.email ??
    (who === 'sandbox' ? 'unattributed (left its session)' : who)
  const totals = Object.entries(eg.totals).map(([who, t]) => h('div', { class: 'hint' },
    `${name(who)}: ${t.allowed.connections} allowed (${t.allowed.bytes_out} B out, ${t.allowed.bytes_in} B in), ${t.denied.connections} refused` +
    (t.model_tokens.input || t.model_tokens.output ? `, model tokens ${t.model_tokens.input} in / ${t.model_tokens.output} out` : '')))

  replace(el,
    h('div', { class: 'panel-head' }, h('h2', null, 'Network'), action('Refresh', refresh)),
    h('p', { class: 'hint' }, 'Code in the sandbox reaches only these hosts, through the room\'s proxy. Loopback, private and cloud metadata addresses stay closed whatever the list says.'),
    h('h3', null, 'Allowed hosts'), allowList, add,
    h('h3', null, 'Package registries'), presets,
    h('h3', null, 'Refused lately'), denied,
    totals.length ? h('section', null, h('h3', null, 'Since the server started'), totals) : null)
}
