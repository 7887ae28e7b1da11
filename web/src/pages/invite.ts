// An invite link: accept it and enter the room.

import { api, ApiError } from '../api'
import type { App } from '../main'
import { errorText, h, replace } from '../dom'

export function invitePage (app: App, token: string): () => void {
  const error = h('p', { class: 'error', role: 'alert' })
  const accept = h('button', { type: 'button', class: 'primary' }, 'Join the room')
  accept.addEventListener('click', async () => {
    accept.disabled = true
    error.textContent = ''
    try {
      const { room_id: roomId } = await api.acceptInvite(token)
      app.go(`/rooms/${roomId}`)
    } catch (e) {
      error.textContent = e instanceof ApiError && (e.status === 404 || e.status === 410)
        ? 'This invite link is no longer valid: it expired, was used up, or was revoked. Ask for a new one.'
        : errorText(e)
      accept.disabled = false
    }
  })
  replace(app.main, h('section', { class: 'card narrow stack' },
    h('h1', null, 'You were invited to a room'),
    h('p', null, 'You are logged in as ', h('strong', null, app.me?.email ?? ''), '. Joining adds you with the role the invite carries.'),
    accept, error))
  accept.focus()
  return () => {}
}
