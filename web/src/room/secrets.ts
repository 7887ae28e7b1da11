// The Secrets panel: the room's secrets by rule (never by value), adding one (the value goes to
// the server once and is cleared from the page), and removing one.

import { api, type Room, type SecretRule } from '../api'
import { abilities } from '../caps'
import { action, h, replace, toast, when } from '../dom'

export async function secretsPanel (el: HTMLElement, room: Room, refresh: () => void): Promise<void> {
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
        const list = hosts.value.split(/[\s,]+/).map((x) => x.trim()).filter(Boolean)
        try {
          await api.addSecret(room.id, { name: name.value.trim(), value: value.value, hosts: list, header: header.value.trim(), format: format.value })
        } finally {
          value.value = ''
        }
        toast(`Secret ${name.value.trim()} added.`)
        refresh()
      }, { class: 'primary', 'data-testid': 'secret-add' }))
    : h('p', { class: 'hint' }, 'Adding secrets needs add_secret.')

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
    add)
}
