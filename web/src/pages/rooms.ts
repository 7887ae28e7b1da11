// Your rooms, and a new one.

import { api, list, type RoomSummary } from '../api'
import type { App } from '../main'
import { errorText, h, replace } from '../dom'

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
  replace(app.main, h('section', { class: 'card' },
    h('h1', null, 'Your rooms'), items,
    h('h2', null, 'New room'), form, error))
  name.focus()

  api.rooms().then((r) => {
    const rooms = list<RoomSummary>(r)
    replace(items, rooms.length === 0
      ? h('li', { class: 'hint' }, 'No rooms yet. Create one, or open an invite link someone sent you.')
      : rooms.map((room) => h('li', null, h('a', {
        href: `/rooms/${room.id}`,
        onclick: (e: Event) => { e.preventDefault(); app.go(`/rooms/${room.id}`) },
      }, room.name))))
  }).catch((err) => { error.textContent = errorText(err) })
  return () => {}
}
