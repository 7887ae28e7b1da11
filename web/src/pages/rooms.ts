// Your rooms, and a new one.

import { api, list, type RoomSummary } from '../api'
import type { App } from '../main'
import { confirmButton, errorText, h, replace, toast, when } from '../dom'
import { ROLE_MEANING } from '../notices'

export function roomsPage (app: App): () => void {
  const items = h('ul', { class: 'rooms', 'aria-label': 'Your rooms' }, h('li', { class: 'hint' }, 'Loading…'))
  const error = h('p', { class: 'error', role: 'alert' })
  const name = h('input', { name: 'name', required: true, maxlength: 100, placeholder: 'parser-fix', 'aria-label': 'Room name' })
  const form = h('form', { class: 'row' }, name, h('button', { type: 'submit', class: 'primary' }, 'Create room'))
  form.addEventListener('submit', async (e) => {
    e.preventDefault()
    error.textContent = ''
    try {
      const { id } = await api.createRoom(name.value.trim())
      app.go(`/rooms/${id}`)
    } catch (err) {
      error.textContent = errorText(err)
    }
  })
  // The name others see in rooms (cursors, people, the audit log), instead of the email.
  const shown = h('input', { maxlength: 64, placeholder: app.me?.email ?? '', value: app.me?.display_name ?? '', 'aria-label': 'Your name', 'data-testid': 'display-name' }) as HTMLInputElement
  const nameError = h('p', { class: 'error', role: 'alert' })
  const nameForm = h('form', { class: 'row' }, shown, h('button', { type: 'submit', 'data-testid': 'display-name-save' }, 'Save'))
  nameForm.addEventListener('submit', async (e) => {
    e.preventDefault()
    nameError.textContent = ''
    try {
      const m = await api.setDisplayName(shown.value.trim() || null)
      if (app.me) app.me = { ...app.me, display_name: m.display_name ?? null }
      toast(m.display_name ? `Others see you as ${m.display_name}.` : 'Others see your email.')
      app.reload()
    } catch (err) {
      nameError.textContent = errorText(err)
    }
  })
  replace(app.main, h('section', { class: 'card' },
    h('h1', null, 'Your rooms'), items,
    h('h2', null, 'New room'), form, error,
    h('h2', null, 'Your name'),
    h('p', { class: 'hint' }, 'What others in your rooms see you as; your email when blank.'),
    nameForm, nameError))
  name.focus()

  const row = (room: RoomSummary): HTMLElement => {
    const li = h('li', { class: 'room-item', 'data-testid': `room-${room.name}` })
    const state = h('span', { class: 'hint', role: 'status' })
    const leave = confirmButton('Leave', 'Confirm: leave this room', async () => {
      try {
        await api.removeParticipant(room.id, app.me?.id ?? '')
      } catch (e) {
        state.textContent = errorText(e)
        throw e
      }
      toast(`You left ${room.name}.`)
      li.remove()
    }, { class: 'small', 'data-testid': `leave-${room.name}` })
    // Asks once, in words, as everything that destroys data does.
    const del = room.role === 'owner'
      ? confirmButton('Delete…', 'Click again: ask an admin to delete it', async () => {
        try {
          await api.requestDeletion(room.id)
          state.textContent = 'Deletion asked: a system admin must confirm it.'
        } catch (e) {
          state.textContent = errorText(e)
          throw e
        }
      }, { class: 'danger small', 'data-testid': `delete-${room.name}` })
      : null
    const facts = [
      room.role ? `${room.role}: ${ROLE_MEANING[room.role] ?? 'custom rights'}` : null,
      room.members !== undefined ? `${room.members} ${room.members === 1 ? 'person' : 'people'}` : null,
      room.last_activity ? `last active ${when(room.last_activity)}` : null,
      `sandbox ${room.sandbox ?? 'not started yet'}`,
    ].filter(Boolean).join(' · ')
    replace(li,
      h('div', { class: 'row' }, h('a', {
        href: `/rooms/${room.id}`,
        onclick: (e: Event) => { e.preventDefault(); app.go(`/rooms/${room.id}`) },
      }, room.name), h('span', { class: 'spacer' }), leave, del),
      h('p', { class: 'meaning' }, facts), state)
    return li
  }
  api.rooms().then((r) => {
    const rooms = list<RoomSummary>(r)
    replace(items, rooms.length === 0
      ? h('li', { class: 'hint' }, 'No rooms yet. Create one, or open an invite link someone sent you.')
      : rooms.map(row))
  }).catch((err) => { error.textContent = errorText(err) })
  return () => {}
}
