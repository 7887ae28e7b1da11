// The Spend panel: what the room used of each meter, who used it, the budget, and setting or
// raising it (a raise waits for someone else's approval, then applies).

import { api, list, METERS, type Approval, type Limits, type Meter, type Room, type SpendView } from '../api'
import { abilities } from '../caps'
import { action, h, toast } from '../dom'

const LABELS: Record<Meter, string> = {
  sandbox_seconds: 'Sandbox time',
  execs: 'Commands run',
  egress_bytes: 'Network traffic',
  model_tokens: 'Model tokens',
  tool_calls: 'Agent tool calls',
}

/** A meter's amount in human units. */
export function amount (m: Meter, n: number): string {
  if (m === 'sandbox_seconds') {
    if (n < 60) return `${n} s`
    const min = Math.floor(n / 60)
    return min < 60 ? `${min} min ${n % 60} s` : `${Math.floor(min / 60)} h ${min % 60} min`
  }
  if (m === 'egress_bytes') {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
    let v = n
    let u = 0
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u++ }
    return `${u === 0 ? v : v.toFixed(1)} ${units[u]}`
  }
  return n.toLocaleString('en')
}

function same (a: Limits | null | undefined, b: Limits): boolean {
  const norm = (l: Limits | null | undefined): string =>
    JSON.stringify(METERS.filter((m) => l?.[m] != null).map((m) => [m, l?.[m]]))
  return norm(a) === norm(b)
}

export async function spendPanel (el: HTMLElement, room: Room, selfId: string, refresh: () => void): Promise<void> {
  const s: SpendView = await api.spend(room.id)
  const can = abilities(room.my_capabilities)

  const meters = h('table', { class: 'kv spend', 'data-testid': 'spend-meters' },
    h('thead', null, h('tr', null, h('th', null, 'Meter'), h('th', null, 'Used'), h('th', null, 'Budget'), h('th', null, 'Left'))),
    h('tbody', null, METERS.map((m) => {
      const limit = s.budget?.[m]
      const left = s.remaining[m]
      return h('tr', { 'data-testid': `spend-${m}`, class: left === 0 ? 'spent' : '' },
        h('th', null, LABELS[m]),
        h('td', null, amount(m, s.used[m])),
        h('td', null, limit != null ? amount(m, limit) : 'no limit'),
        h('td', null, left != null ? (left === 0 ? 'spent' : amount(m, left)) : '—'))
    })))

  const tiers = Object.entries(s.by_tier)
  const who = s.participants.length
    ? h('table', { class: 'kv spend', 'data-testid': 'spend-who' },
      h('thead', null, h('tr', null, h('th', null, 'Who'), h('th', null, 'Used'))),
      h('tbody', null, s.participants.map((p) => h('tr', { 'data-testid': `spend-who-${p.name}` },
        h('th', null, p.who === selfId ? `${p.name} (you)` : p.name),
        h('td', null, METERS.filter((m) => p.used[m] > 0).map((m) => `${LABELS[m]}: ${amount(m, p.used[m])}`).join(' · ') || '—',
          p.budget && Object.keys(p.budget).length
            ? h('div', { class: 'hint' }, 'Own budget: ', METERS.filter((m) => p.budget?.[m] != null).map((m) => `${LABELS[m]} ${amount(m, p.budget?.[m] ?? 0)}`).join(' · '))
            : null)))))
    : h('p', { class: 'hint' }, 'Nothing used yet.')

  // Setting a budget: lowering applies at once; a raise asks someone who holds approve, and
  // once approved the same values apply with that approval.
  const inputs = new Map<Meter, HTMLInputElement>()
  const form = can.spend
    ? h('div', { class: 'budget-form' },
      h('h3', null, s.budget ? 'Change the budget' : 'Set a budget'),
      METERS.map((m) => {
        const input = h('input', {
          // Text with a numeric keyboard, not type=number: a number field hides its selection,
          // so a live redraw could not keep a whole-field selection the typist is typing over.
          type: 'text', inputmode: 'numeric', pattern: '[0-9]*', placeholder: 'no limit',
          value: s.budget?.[m] != null ? String(s.budget[m]) : '',
          'aria-label': `Budget for ${LABELS[m]}`, 'data-testid': `budget-${m}`,
        })
        inputs.set(m, input)
        const unit = m === 'sandbox_seconds' ? 'seconds' : m === 'egress_bytes' ? 'bytes' : ''
        return h('label', { class: 'row' }, h('span', null, LABELS[m]), input, unit ? h('span', { class: 'hint' }, unit) : null)
      }),
      action('Save budget', async () => {
        const budget: Limits = {}
        for (const [m, input] of inputs) {
          const v = input.value.trim().replace(/[\s,_]/g, '')
          if (v === '') continue
          if (!/^[0-9]+$/.test(v)) {
            toast(`The budget for ${LABELS[m]} must be a whole number (or empty for no limit).`, 'error')
            input.focus()
            return
          }
          budget[m] = Number(v)
        }
        const wanted = Object.keys(budget).length ? budget : null
        const approved = list<Approval>(await api.approvals(room.id)).find((a) =>
          a.action === 'set_budget' && a.state === 'approved' && a.requester === selfId &&
          (a.params as { agent?: unknown, budget?: Limits } | null)?.agent == null &&
          same((a.params as { budget?: Limits }).budget, budget))
        const r = await api.setBudget(room.id, { budget: wanted, ...(approved ? { approval_id: approved.id } : {}) })
        toast(r.state === 'pending_approval'
          ? 'That raises the budget: someone who holds approve decides in the Approvals panel; save again once approved.'
          : 'Budget saved.')
        refresh()
      }, { class: 'primary', 'data-testid': 'budget-save' }))
    : h('p', { class: 'hint' }, 'Setting the budget needs spend.')

  el.append(
    h('div', { class: 'panel-head' }, h('h2', null, 'Spend'), action('Refresh', refresh)),
    s.budget
      ? h('p', { class: 'hint' }, 'At the budget, metered work stops with a message (nothing made is lost); starting metered work here needs spend.')
      : h('p', { class: 'hint', 'data-testid': 'spend-no-budget' }, 'This room has no budget: everything is metered, nothing is limited.'),
    meters,
    h('p', { class: 'hint', hidden: tiers.length === 0 }, 'Sandbox time by tier: ', tiers.map(([t, n]) => `${t} ${amount('sandbox_seconds', n)}`).join(', ')),
    h('h3', null, 'Who used what'), who,
    form)
}
