// Light or dark: the system's setting, unless the person chose one (kept in this browser).

import { browserStore, type Store } from './layout'

export type Theme = 'light' | 'dark'

const KEY = 'coderoom:theme'

/** The person's own choice, if they made one. */
export function chosenTheme (store: Store | null): Theme | null {
  try {
    const v = store?.getItem(KEY)
    return v === 'light' || v === 'dark' ? v : null
  } catch {
    return null
  }
}

/** The theme in force: the choice, else the system's. */
export function themeFor (chosen: Theme | null, systemDark: boolean): Theme {
  return chosen ?? (systemDark ? 'dark' : 'light')
}

const media = (): MediaQueryList | null =>
  typeof window.matchMedia === 'function' ? window.matchMedia('(prefers-color-scheme: dark)') : null

/** Applies the theme to the page, and follows the system's changes while no choice is made. */
export function applyTheme (): Theme {
  const theme = themeFor(chosenTheme(browserStore()), media()?.matches ?? false)
  document.documentElement.dataset.theme = theme
  return theme
}

/** Switches to the other theme and remembers the choice. */
export function toggleTheme (): Theme {
  const next: Theme = document.documentElement.dataset.theme === 'dark' ? 'light' : 'dark'
  try { browserStore()?.setItem(KEY, next) } catch { /* not remembered */ }
  document.documentElement.dataset.theme = next
  return next
}

/** Keeps following the system while the person has not chosen. */
export function followSystem (): void {
  media()?.addEventListener('change', () => { if (chosenTheme(browserStore()) === null) applyTheme() })
}
