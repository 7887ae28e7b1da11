import { describe, expect, it } from 'vitest'
import { clampFiles, clampTerm, loadLayout, MAX_FILES_PX, MIN_FILES_PX, loadTabs, MIN_PANE_PX, saveLayout, saveTabs, splitAt, type Store } from './layout'

function memory (): Store & { data: Map<string, string> } {
  const data = new Map<string, string>()
  return { data, getItem: (k) => data.get(k) ?? null, setItem: (k, v) => { data.set(k, v) } }
}

describe('layout preferences', () => {
  it('are remembered per person, defaults otherwise', () => {
    const s = memory()
    expect(loadLayout(s, 'u1')).toEqual({ termPx: null, termMax: false, sideHidden: false, filesPx: null })
    saveLayout(s, 'u1', { termPx: 300, termMax: true, sideHidden: true, filesPx: 320 })
    expect(loadLayout(s, 'u1')).toEqual({ termPx: 300, termMax: true, sideHidden: true, filesPx: 320 })
    expect(loadLayout(s, 'u2').termPx).toBeNull()
  })

  it('ignore what is malformed', () => {
    const s = memory()
    s.setItem('coderoom:layout:u1', '{"termPx": "big", "termMax": 1, "filesPx": "wide"}')
    expect(loadLayout(s, 'u1')).toEqual({ termPx: null, termMax: false, sideHidden: false, filesPx: null })
    s.setItem('coderoom:layout:u1', '{"filesPx": 5000}')
    expect(loadLayout(s, 'u1').filesPx).toBe(MAX_FILES_PX)
    s.setItem('coderoom:layout:u1', 'not json')
    expect(loadLayout(s, 'u1').termPx).toBeNull()
    expect(loadLayout(null, 'u1').termPx).toBeNull()
  })

  it('keep both panes usable', () => {
    expect(clampTerm(10, 800)).toBe(MIN_PANE_PX)
    expect(clampTerm(790, 800)).toBe(800 - MIN_PANE_PX)
    expect(splitAt(500, 100, 900)).toBe(400)
    expect(clampFiles(10)).toBe(MIN_FILES_PX)
    expect(clampFiles(300.4)).toBe(300)
  })
})

describe('tabs', () => {
  it('come back per room and person, the active one among them', () => {
    const s = memory()
    saveTabs(s, 'r1', 'u1', { open: ['a.py', 'b.md'], active: 'b.md' })
    expect(loadTabs(s, 'r1', 'u1')).toEqual({ open: ['a.py', 'b.md'], active: 'b.md' })
    expect(loadTabs(s, 'r2', 'u1')).toEqual({ open: [], active: null })
    s.setItem('coderoom:tabs:r1:u1', '{"open": ["a", 3], "active": "gone"}')
    expect(loadTabs(s, 'r1', 'u1')).toEqual({ open: ['a'], active: null })
  })
})

describe('theme', () => {
  it('is the person\'s choice, else the system\'s', async () => {
    const { chosenTheme, themeFor } = await import('./theme')
    const s = memory()
    expect(chosenTheme(s)).toBeNull()
    expect(themeFor(null, true)).toBe('dark')
    expect(themeFor(null, false)).toBe('light')
    s.setItem('coderoom:theme', 'light')
    expect(themeFor(chosenTheme(s), true)).toBe('light')
    s.setItem('coderoom:theme', 'purple')
    expect(chosenTheme(s)).toBeNull()
  })
})
