// An invite link: what it offers (the room, who invited, the role), then accept it and enter.

import { api, ApiError, type InviteShown } from '../api'
import type { App } from '../main'
import { errorText, h, replace } from '../dom'
import { ROLES } from '../caps'
import { capsInWords } from '../notices'

/** A role in one line, as the person invited reads it. */
export function roleMeaning (role: string): string {
  switch (role) {
    case 'owner': return 'an owner: can do everything, inviting and deleting included'
    case 'editor': return 'an editor: can edit files and run commands'
    case 'viewer': return 'a viewer: can watch the files and the terminal, not change them'
    default: return `a ${role}`
  }
}

const GONE = 'This invite link is no longer valid: it expired, was used up, or was revoked. Ask for a new one.'

export function invitePage (app: App, token: string): () => void {
  const error = h('p', { class: 'error', role: 'alert', 'data-testid': 'invite-error' })
  const offer = h('p', { 'data-testid': 'invite-offer' }, 'Reading the invite…')
  const accept = h('button', { type: 'button', class: 'primary', disabled: true }, 'Join the room')
  let left = false
  const gone = (message: string): void => {
    offer.hidden = true
    accept.hidden = true
    error.textContent = `${message} Ask whoever sent it for a new one.`
  }
  accept.addEventListener('click', async () => {
    accept.disabled = true
    error.textContent = ''
    try {
      const { room_id: roomId } = await api.acceptInvite(token)
      app.go(`/rooms/${roomId}`)
    } catch (e) {
      error.textContent = e instanceof ApiError && (e.status === 404 || e.status === 410) ? GONE : errorText(e)
      accept.disabled = false
    }
  })
  replace(app.main, h('section', { class: 'card narrow stack' },
    h('h1', null, 'You were invited to a room'),
    offer,
    h('p', { class: 'hint' }, 'You are logged in as ', h('strong', null, app.me?.email ?? ''), '.'),
    accept, error))
  void api.showInvite(token).then((inv: InviteShown) => {
    if (left) return
    const preset = ROLES[inv.role] ?? []
    const caps = inv.capabilities ?? preset
    const chosen = caps.length !== preset.length || caps.some((c) => !preset.includes(c))
    const what = capsInWords(caps)
    replace(offer, inv.invited_by ? h('strong', null, inv.invited_by) : 'Someone', ' invited you to ',
      h('strong', { 'data-testid': 'invite-room' }, inv.room_name),
      chosen ? `, to ${what}.` : ` as ${roleMeaning(inv.role)}.`)
    if (inv.email && inv.email !== app.me?.email) {
      // Sent to someone else: say so before they try.
      error.textContent = `This invite was sent to ${inv.email}: log in as that address to join.`
      accept.disabled = true
      return
    }
    accept.disabled = false
    accept.focus()
  }, (e: unknown) => {
    if (left) return
    if (e instanceof ApiError && e.status === 410) gone(e.message)
    else if (e instanceof ApiError && e.status === 404) gone('This invite link does not exist.')
    else if (e instanceof ApiError && e.status === 403) {
      // Sent to someone else: nothing of it is shown, and there is nothing to try.
      offer.hidden = true
      accept.hidden = true
      error.textContent = e.message.charAt(0).toUpperCase() + e.message.slice(1)
    }
    else { offer.textContent = 'The invite could not be read; you can still try to join.'; accept.disabled = false }
  })
  return () => { left = true }
}
