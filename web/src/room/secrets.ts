// The Secrets panel: the room's secrets by rule (never by value), adding one (the value goes to
// the server once and is cleared from the page), and removing one.

import { api, list, type Approval, type Room, type SecretRule } from '../api'
import { abilities } from '../caps'
import { action, h, replace, toast, when } from '../dom'

/** Whether an approval's parameters name exactly this rule (key order aside). */
function sameRule (params: unknown, rule: { name: string, hosts: string[], header: string, format: string }): boolean {
  const p = params as { name?: string, hosts?: string[], header?: string, format?: string } | null
  return p?.name === rule.name && p.header === rule.header && p.format === rule.format &&
    JSON.stringify(p.hosts) === JSON.stringify(rule.hosts)
}

export async function secretsPanel (el: HTMLElement, room: Room, selfId: string, refresh: () => void): Promise<void> {
  const items = await api.secrets(room.id)
  const can = abilities(room.my_capabilities)
  const by = (id: string): string => room.participants.find((p) => p.user_id === id)?.email ?? id

  const name = h('input', { type: 'text', placeholder: 'NAME, e.g. OPENAI_API_KEY', 'aria-label': 'Secret name', 'data-testid': 'secret-name', maxlength: 64, autocomplete: 'off' })
  // Not echoed, not kept by the browser.
  const value = h('input', { type: 'password', placeholder: 'Value', 'aria-label': 'Secret value', 'data-testid': 'secret-value', autocomplete: 'new-password' })
  const hosts = h('input', { type: 'text', placeholder: 'api.example.com, *.example.org', 'aria-label': 'Hosts it may go to', 'data-testid': 'secret-hosts' })
  const header = h('input', { type: 'text', value: 'Authorization', 'aria-label': 'Header', 'data-testid': 'secret-header', maxlength: 64 })
  const format = h('input', { type: 'text', value: 'Bearer {}', 'aria-label': 'Format ({} is the value)', 'data-testid': 'secret-format', maxlength: 256 })
  const add = can.addSecret
    ? h('section', { class: 'stack' },
      h('h3', null, 'Add a secret'),
      h('p', { class: 'hint' }, 'The value is sealed on the server the moment it arrives. Nobody can read it back: not you, not the room, not code in the sandbox. It will be added to requests for its hosts only, as the header says.'),
      name, value, hosts, h('div', { class: 'row' }, header, format),
      action('Add', async () => {
        const rule = {
          name: name.value.trim(),
          hosts: hosts.value.split(/[\s,]+/).map((x) => x.trim().toLowerCase()).filter(Boolean).sort(),
          header: header.value.trim(),
          format: format.value,
        }
        // Where the room asks for approvals, one already given to me for this rule is used.
        const approved = room.secrets_need_approval
          ? list<Approval>(await api.approvals(room.id)).find((a) => a.action === 'add_secret' && a.state === 'approved' &&
            a.requester === selfId && sameRule(a.params, rule))
          : undefined
        let out
        try {
          out = await api.addSecret(room.id, { ...rule, value: value.value, ...(approved ? { approval_id: approved.id } : {}) })
        } finally {
          value.value = ''
        }
        toast(out?.state === 'pending_approval'
          ? 'This room asks for an approval first: once someone who holds approve agrees (Approvals panel), add it again with its value.'
          : `Secret ${rule.name} added.`)
        refresh()
      }, { class: 'primary', 'data-testid': 'secret-add' }))
    : h('p', { class: 'hint' }, 'Adding secrets needs add_secret.')

  const policy = (): HTMLElement => {
    const box = h('input', { type: 'checkbox', checked: room.secrets_need_approval ?? false, 'data-testid': 'secrets-policy' })
    box.addEventListener('change', () => {
      api.setSecretsPolicy(room.id, box.checked)
        .then(() => { toast(box.checked ? 'New secrets now need an approval.' : 'New secrets no longer need an approval.'); refresh() })
        .catch((e: unknown) => { box.checked = !box.checked; toast(String(e), 'error') })
    })
    return h('label', { class: 'row' }, box, 'Adding a secret needs someone else\'s approval')
  }
  const row = (s: SecretRule): HTMLElement => h('li', { class: 'secret', 'data-testid': 'secret' },
    h('div', null, h('strong', null, s.name), ' → ', s.hosts.join(', ')),
    h('div', { class: 'hint' }, `${s.header}: ${s.format.replace('{}', '•••')} · added ${when(s.created_at)} by ${by(s.created_by)} · last used ${s.last_used_at ? when(s.last_used_at) : 'never'}`),
    can.addSecret
      ? action('Delete', async () => { await api.removeSecret(room.id, s.name); toast(`Secret ${s.name} deleted.`); refresh() }, { class: 'danger', 'data-testid': `secret-delete-${s.name}` })
      : null)

  replace(el,
    h('div', { class: 'panel-head' }, h('h2', null, 'Secrets'), action('Refresh', refresh)),
    h('p', { class: 'hint' }, 'Code in the sandbox sees CODEROOM_SECRET_<NAME> holding a placeholder; the room\'s proxy puts the value into requests for the secret\'s hosts only (they must be allowed in Network too).'),
    items.length ? h('ul', { class: 'approvals' }, items.map(row)) : h('p', { class: 'hint' }, 'No secrets.'),
    add,
    can.approve ? policy() : null)
}
