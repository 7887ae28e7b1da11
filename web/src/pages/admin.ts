// The admin console (system admins): find an account and revoke it everywhere; confirm the room
// deletions owners asked for, and read the receipts of those done.

import { api, type AdminDeletion, type AdminUser } from '../api'
import { verifyChain } from '../audit'
import { auditSentence } from '../auditText'
import type { App } from '../main'
import { confirmButton, errorText, h, replace, toast, when } from '../dom'

export function adminPage (app: App): () => void {
  if (!app.me?.is_admin) {
    replace(app.main, h('section', { class: 'card' }, h('h1', null, 'Admin'),
      h('p', null, 'This page is for system admins.')))
    return () => {}
  }
  const search = h('input', { type: 'search', placeholder: 'Search by email', 'aria-label': 'Search accounts by email', 'data-testid': 'admin-search' })
  const users = h('div', { 'data-testid': 'admin-users' }, 'Loading…')
  const deletions = h('div', { 'data-testid': 'admin-deletions' }, 'Loading…')
  const chain = h('div', { 'data-testid': 'admin-audit' }, 'Loading…')
  replace(app.main, h('section', { class: 'card stack admin' },
    h('h1', null, 'Admin'),
    h('h2', null, 'Accounts'), search, users,
    h('h2', null, 'Room deletions'), deletions,
    h('h2', null, 'System audit chain'), chain))

  let disposed = false
  let seq = 0
  const loadUsers = async (): Promise<void> => {
    const mine = ++seq
    try {
      const list = await api.adminUsers(search.value.trim())
      if (!disposed && mine === seq) showUsers(list)
    } catch (e) {
      if (!disposed) replace(users, h('p', { class: 'error', role: 'alert' }, errorText(e)))
    }
  }
  const showUsers = (list: AdminUser[]): void => {
    if (list.length === 0) { replace(users, h('p', { class: 'hint' }, 'No account matches.')); return }
    replace(users, h('ul', { class: 'people' }, list.map((u) => {
      const self = u.id === app.me?.id
      const confirming = `Confirm: remove ${u.email} from ${u.rooms.length} room${u.rooms.length === 1 ? '' : 's'} and end every session`
      const restore = u.revoked_at === null ? null : h('button', { type: 'button', class: 'small', 'data-testid': `restore-${u.email}` }, 'Restore account')
      restore?.addEventListener('click', async () => {
        try {
          const r = await api.restoreUser(u.id)
          toast(`${r.email} may log in again (into no room).`)
        } catch (e) {
          toast(errorText(e), 'error')
        }
        await loadUsers()
      })
      const revoke = self || u.revoked_at !== null ? null : confirmButton('Revoke everywhere…', confirming, async () => {
        let r
        try {
          r = await api.revokeUser(u.id)
        } catch (e) {
          toast(errorText(e), 'error')
          throw e
        }
        toast(`${r.email} was removed from ${r.rooms.length} room${r.rooms.length === 1 ? '' : 's'}; ${r.sessions} session${r.sessions === 1 ? '' : 's'} ended.`)
        await loadUsers()
      }, { class: 'danger small', 'data-testid': `revoke-${u.email}` })
      return h('li', { class: 'person', 'data-testid': `account-${u.email}` },
        h('div', { class: 'person-head' }, h('strong', null, u.email), self ? h('span', { class: 'hint' }, ' (you)') : null,
          u.revoked_at !== null ? h('span', { class: 'badge danger', 'data-testid': `revoked-${u.email}` }, `Revoked ${when(u.revoked_at)}: cannot log in`) : null),
        h('p', { class: 'meaning' }, u.rooms.length
          ? `In ${u.rooms.map((r) => `${r.name} (${r.role})`).join(', ')}.`
          : 'In no room.', ' ', u.last_login ? `Last logged in ${when(u.last_login)}.` : 'No session.'),
        revoke, restore)
    })))
  }
  const loadDeletions = async (): Promise<void> => {
    try {
      const list = await api.adminDeletions()
      if (!disposed) showDeletions(list)
    } catch (e) {
      if (!disposed) replace(deletions, h('p', { class: 'error', role: 'alert' }, errorText(e)))
    }
  }
  const showDeletions = (list: AdminDeletion[]): void => {
    if (list.length === 0) { replace(deletions, h('p', { class: 'hint' }, 'No room was asked to be deleted.')); return }
    replace(deletions, h('ul', { class: 'people' }, list.map((d) => {
      const name = d.room_name ?? d.room_id
      const pending = d.state === 'pending_confirmation'
      const confirm = pending ? h('button', { type: 'button', class: 'danger small', 'data-testid': `confirm-${d.id}` }, 'Confirm deletion') : null
      confirm?.addEventListener('click', async () => {
        confirm.disabled = true
        try {
          await api.confirmDeletion(d.id)
          toast(`${name} was deleted; its receipt is kept.`)
          await Promise.all([loadDeletions(), loadUsers()])
        } catch (e) {
          toast(errorText(e), 'error')
          confirm.disabled = false
        }
      })
      return h('li', { class: 'person', 'data-testid': `deletion-${d.id}` },
        h('div', { class: 'person-head' }, h('strong', null, name),
          h('span', { class: 'role' }, pending ? 'waiting for you' : d.state === 'done' ? 'deleted' : 'under way')),
        h('p', { class: 'meaning' }, `Asked by ${d.requested_by_email ?? d.requested_by} ${when(d.requested_at)}.`,
          pending ? ' Confirming destroys the document and its history, the workspace and its snapshots, recordings, secrets, previews and invites.' : ''),
        h('div', { class: 'row' }, confirm, h('a', { href: `/deletions/${d.id}`, onclick: (e: Event) => { e.preventDefault(); app.go(`/deletions/${d.id}`) } }, pending ? 'Details' : 'Receipt')))
    })))
  }
  // The system chain, verified here record by record (the server's word is not taken for it).
  const loadChain = async (): Promise<void> => {
    try {
      const records = await api.adminAudit()
      if (disposed) return
      const verdict = verifyChain('system', records)
      const shown = records.slice(-50).reverse()
      replace(chain,
        verdict.ok
          ? h('p', { class: 'chain ok', 'data-testid': 'admin-chain' }, `✔ Chain verified in this browser: ${verdict.count} records, each hash checked`)
          : h('p', { class: 'chain broken', 'data-testid': 'admin-chain', role: 'alert' }, `✘ Chain broken at record #${verdict.seq}: ${verdict.problem}`),
        h('ol', { class: 'audit', reversed: true }, shown.map((r) => h('li', { class: `audit-record ${r.decision}` },
          h('div', { class: 'audit-sentence' }, auditSentence(r, (id) => id)),
          h('div', { class: 'audit-head hint' }, `#${r.seq} · ${when(r.at)}`)))))
    } catch (e) {
      if (!disposed) replace(chain, h('p', { class: 'error', role: 'alert' }, errorText(e)))
    }
  }
  let timer: ReturnType<typeof setTimeout> | undefined
  search.addEventListener('input', () => { clearTimeout(timer); timer = setTimeout(() => { void loadUsers() }, 250) })
  void loadUsers()
  void loadDeletions()
  void loadChain()
  return () => { disposed = true; clearTimeout(timer) }
}
