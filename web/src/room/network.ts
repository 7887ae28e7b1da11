// The Network panel: what the room's sandbox may reach through the egress proxy (its allowlist
// and package-registry presets), the latest refused connections, and the counters. Changing
// the list needs `approve`; everyone else sees it and can ask an owner.

import { api, type Room } from '../api'
import { abilities } from '../caps'
import { action, h, replace, toast, when } from '../dom'

export async function networkPanel (el: HTMLElement, room: Room, refresh: () => void): Promise<void> {
  const eg = await api.egress(room.id)
  const can = abilities(room.my_capabilities)
  const save = async (allow: string[], presets: string[], said: string): Promise<void> => {
    await api.setEgress(room.id, { allow, presets })
    toast(said)
    refresh()
  }

  const rule = h('input', { type: 'text', placeholder: 'api.example.com, *.example.org, host:8443', 'aria-label': 'Host to allow', 'data-testid': 'egress-rule', maxlength: 260 })
  const add = can.approve
    ? h('div', { class: 'row' }, rule, action('Allow', async () => {
      const v = rule.value.trim().toLowerCase()
      if (!v) return
      await save([...eg.allow, v], eg.presets, `${v} allowed.`)
    }, { class: 'primary', 'data-testid': 'egress-add' }))
    : h('p', { class: 'hint' }, 'Changing what the sandbox can reach needs approve (owners hold it).')

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
        can.approve && d.reason.includes('not on the room')
          ? action(`Allow ${target}`, () => save([...eg.allow, target], eg.presets, `${target} allowed.`), { 'data-testid': `egress-allow-${target}` })
          : null)
    }))
    : h('p', { class: 'hint' }, 'No refused connections since the server started.')

  const totals = Object.entries(eg.totals).map(([who, t]) => h('div', { class: 'hint' },
    `${who}: ${t.allowed.connections} allowed (${t.allowed.bytes_out} B out, ${t.allowed.bytes_in} B in), ${t.denied.connections} refused` +
    (t.model_tokens.input || t.model_tokens.output ? `, model tokens ${t.model_tokens.input} in / ${t.model_tokens.output} out` : '')))

  replace(el,
    h('div', { class: 'panel-head' }, h('h2', null, 'Network'), action('Refresh', refresh)),
    h('p', { class: 'hint' }, 'Code in the sandbox reaches only these hosts, through the room\'s proxy. Loopback, private and cloud metadata addresses stay closed whatever the list says.'),
    h('h3', null, 'Allowed hosts'), allowList, add,
    h('h3', null, 'Package registries'), presets,
    h('h3', null, 'Refused lately'), denied,
    totals.length ? h('section', null, h('h3', null, 'Since the server started'), totals) : null)
}
