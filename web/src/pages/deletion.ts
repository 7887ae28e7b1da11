// A room deletion: its state, the admin's confirmation, and the receipt.

import { api, type Deletion, type Receipt } from '../api'
import type { App } from '../main'
import { errorText, h, replace } from '../dom'

export function receiptView (d: Deletion): HTMLElement {
  const r: Receipt = d.receipt ?? {}
  const artifacts = r.artifacts ?? []
  return h('div', { class: 'receipt', 'data-testid': 'receipt' },
    h('p', null, 'Deletion ', h('code', null, d.deletion_id ?? r.deletion_id ?? ''), ' of room ', h('code', null, r.room_id ?? ''),
      ': ', h('strong', { 'data-testid': 'deletion-state' }, String(d.state ?? (r.complete ? 'done' : ''))), '.'),
    artifacts.length
      ? h('table', null,
        h('thead', null, h('tr', null, h('th', null, 'Artifact'), h('th', null, 'Status'), h('th', null, 'Count'))),
        h('tbody', null, artifacts.map((a) => h('tr', null, h('td', null, a.artifact), h('td', null, a.status), h('td', null, a.count)))))
      : null,
    h('details', null, h('summary', null, 'Full receipt (JSON)'), h('pre', null, JSON.stringify(r, null, 2))))
}

export function deletionPage (app: App, id: string): () => void {
  const body = h('div', null, 'Loading…')
  const error = h('p', { class: 'error', role: 'alert' })
  replace(app.main, h('section', { class: 'card stack' }, h('h1', null, 'Room deletion'), body, error))

  const show = (r: Deletion): void => {
    const pending = r.state === 'pending_confirmation'
    const confirm = pending && app.me?.is_admin
      ? h('button', { type: 'button', class: 'danger', 'data-testid': 'confirm-deletion' }, 'Confirm deletion')
      : null
    confirm?.addEventListener('click', async () => {
      confirm.disabled = true
      try {
        show(await api.confirmDeletion(id))
      } catch (e) {
        error.textContent = errorText(e)
        confirm.disabled = false
      }
    })
    replace(body,
      pending
        ? h('p', null, app.me?.is_admin
          ? 'The room\'s owner asked to delete it. Confirming destroys the document and its history, the workspace, snapshots, recordings, secrets, previews, invites and sessions. It cannot be undone.'
          : 'Waiting for a system admin to confirm. Send them this page\'s address.')
        : null,
      confirm,
      receiptView(r))
  }
  api.deletion(id).then(show).catch((e) => { replace(body); error.textContent = errorText(e) })
  return () => {}
}
