// The app shell: who is logged in, the header, and the router.

import './style.css'
import { api, ApiError, type Me } from './api'
import { h, replace } from './dom'
import { parse, loginUrl, type Route } from './router'
import { loginPage } from './pages/login'
import { roomsPage } from './pages/rooms'
import { invitePage } from './pages/invite'
import { deletionPage } from './pages/deletion'
import { adminPage } from './pages/admin'
import { applyTheme, followSystem, toggleTheme } from './theme'

export interface App {
  me: Me | null
  go: (path: string) => void
  /** Renders the current page again, from scratch. */
  reload: () => void
  main: HTMLElement
}

const root = document.getElementById('app') as HTMLElement
let cleanup: (() => void) | null = null
/** Each navigation's number: a render that awaited and was overtaken stops. */
let renders = 0

const app: App = {
  me: null,
  main: h('main', { id: 'main' }),
  go (path: string) {
    history.pushState(null, '', path)
    void render()
  },
  reload () {
    void render()
  },
}

function header (): HTMLElement {
  const me = app.me
  return h('header', { class: 'top' },
    h('a', { href: '/', class: 'brand', onclick: link('/') }, 'Coderoom'),
    h('span', { id: 'room-title', class: 'room-title' }),
    h('span', { class: 'spacer' }),
    themeButton(),
    me
      ? h('span', { class: 'who' },
        h('span', { class: 'me', 'data-testid': 'me' }, me.display_name ? `${me.display_name} (${me.email})` : me.email, me.is_admin ? ' (admin)' : ''),
        me.is_admin ? h('a', { href: '/admin', class: 'admin-link', onclick: link('/admin'), 'data-testid': 'admin-link' }, 'Admin') : null,
        h('button', { type: 'button', class: 'link', onclick: logout }, 'Log out'))
      : null)
}

/** Labels the header's current theme button (the header is drawn anew with each page). */
let relabelTheme: (() => void) | null = null
// The label follows the theme however it changes (a click, the system's setting).
new MutationObserver(() => relabelTheme?.()).observe(document.documentElement, { attributes: true, attributeFilter: ['data-theme'] })

function themeButton (): HTMLElement {
  const b = h('button', { type: 'button', class: 'small theme-toggle', 'data-testid': 'theme-toggle' })
  const label = (): void => {
    const dark = document.documentElement.dataset.theme === 'dark'
    b.textContent = dark ? '☀ Light' : '☾ Dark'
    b.setAttribute('aria-label', dark ? 'Switch to the light theme' : 'Switch to the dark theme')
  }
  b.addEventListener('click', () => { toggleTheme() })
  relabelTheme = label
  label()
  return b
}

function link (path: string) {
  return (e: Event) => { e.preventDefault(); app.go(path) }
}

async function logout (): Promise<void> {
  try { await api.logout() } catch { /* the session may already be gone */ }
  app.me = null
  app.go('/login')
}

async function render (): Promise<void> {
  const seq = ++renders
  cleanup?.()
  cleanup = null
  const route: Route = parse(location.pathname, location.search)
  if (app.me === null && route.page !== 'login') {
    try {
      const me = await api.me()
      if (seq !== renders) return
      app.me = me
    } catch (e) {
      if (seq !== renders) return
      if (e instanceof ApiError && e.status === 401) {
        history.replaceState(null, '', loginUrl(location.pathname + location.search))
        return render()
      }
      replace(root, h('p', { class: 'error', role: 'alert' }, `The server cannot be reached: ${(e as Error).message}`))
      return
    }
  }
  app.main = h('main', { id: 'main' })
  replace(root, header(), app.main)
  switch (route.page) {
    case 'login': cleanup = loginPage(app, route.next); break
    case 'rooms': cleanup = roomsPage(app); break
    case 'room': {
      // The editor and terminal (most of the code) load only when a room is opened, so the
      // login and room list pages come up fast.
      replace(app.main, h('p', { class: 'card hint' }, 'Opening the room…'))
      let room: typeof import('./room/room')
      try {
        room = await import('./room/room')
      } catch (e) {
        if (seq === renders) {
          replace(app.main, h('p', { class: 'card error', role: 'alert' },
            `The room could not be loaded (${(e as Error).message}). Reload the page to try again.`))
        }
        return
      }
      if (seq !== renders) return
      cleanup = room.roomPage(app, route.id)
      break
    }
    case 'invite': cleanup = invitePage(app, route.token); break
    case 'deletion': cleanup = deletionPage(app, route.id); break
    case 'admin': cleanup = adminPage(app); break
    default:
      replace(app.main, h('section', { class: 'card' }, h('h1', null, 'Not found'),
        h('p', null, 'There is no page at ', h('code', null, route.path), '. ',
          h('a', { href: '/', onclick: link('/') }, 'Back to your rooms'))))
  }
}

window.addEventListener('popstate', () => { void render() })
applyTheme()
followSystem()
void render()
