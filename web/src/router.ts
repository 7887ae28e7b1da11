// Client-side routes. The server answers every non-API path with the app shell, so these are
// real URLs (an invite link opens straight onto its page).

export type Route =
  | { page: 'rooms' }
  | { page: 'login', next: string }
  | { page: 'room', id: string }
  | { page: 'invite', token: string }
  | { page: 'deletion', id: string }
  | { page: 'admin' }
  | { page: 'not_found', path: string }

const ID = /^[A-Za-z0-9_-]{1,128}$/

export function parse (pathname: string, search = ''): Route {
  let parts: string[]
  try {
    parts = pathname.split('/').filter(Boolean).map(decodeURIComponent)
  } catch {
    return { page: 'not_found', path: pathname }
  }
  if (parts.length === 0 || (parts.length === 1 && parts[0] === 'rooms')) return { page: 'rooms' }
  if (parts.length === 1 && parts[0] === 'admin') return { page: 'admin' }
  if (parts.length === 1 && parts[0] === 'login') {
    return { page: 'login', next: safeNext(new URLSearchParams(search).get('next')) }
  }
  if (parts.length === 2 && ID.test(parts[1])) {
    if (parts[0] === 'rooms') return { page: 'room', id: parts[1] }
    if (parts[0] === 'invite') return { page: 'invite', token: parts[1] }
    if (parts[0] === 'deletions') return { page: 'deletion', id: parts[1] }
  }
  return { page: 'not_found', path: pathname }
}

/** Where to go after login: only a path on this origin (no open redirect). The URL parser
 *  decides, as the browser will (it strips tabs and newlines, reads backslashes as slashes). */
export function safeNext (next: string | null): string {
  if (!next || !next.startsWith('/')) return '/'
  const base = 'http://this.invalid'
  let u: URL
  try {
    u = new URL(next, base)
  } catch {
    return '/'
  }
  if (u.origin !== base) return '/'
  // Dot segments can leave `//host`, which the browser would read as another origin.
  if (u.pathname.startsWith('//')) return '/'
  return u.pathname + u.search + u.hash
}

export function loginUrl (next: string): string {
  return next === '/' ? '/login' : `/login?next=${encodeURIComponent(next)}`
}
