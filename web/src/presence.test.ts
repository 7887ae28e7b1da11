import { describe, expect, it } from 'vitest'
import { busiest, initials, inkOn, peers, type Peer } from './presence'

describe('presence', () => {
  it('lists everyone else once, with where they are', () => {
    const states = new Map<number, unknown>([
      [1, { user: { id: 'me', name: 'me@x', color: '#123456' } }],
      [2, { user: { id: 'u-ana', name: 'ana@example.com', color: '#aa3300' }, file: 'a.py', cursor: { head: { item: null } } }],
      [3, { user: { id: 'u-ana', name: 'ana@example.com', color: '#aa3300' } }],
      [4, { user: { id: 'u-ben', name: 'ben@example.com', color: 'red;background:url(x)' } }],
      [5, { nothing: true }],
    ])
    const list = peers(states, 'me')
    expect(list.map((p) => [p.name, p.file])).toEqual([['ana@example.com', 'a.py'], ['ben@example.com', null]])
    expect(list[0].head).toEqual({ item: null })
    expect(list[1].color).toBe('#5f6b7a')
  })

  it('makes initials', () => {
    expect(initials('ana@example.com')).toBe('AN')
    expect(initials('ana.lopez@example.com')).toBe('AL')
    expect(initials('')).toBe('?')
  })
})

describe('the busiest file', () => {
  const at = (file: string | null): Peer => ({ id: Math.random().toString(), name: 'x', color: '#000', file, head: null })
  it('is where most others are', () => {
    expect(busiest([at('a.py'), at('b.md'), at('b.md'), at(null)])).toBe('b.md')
    expect(busiest([at('z.py'), at('a.py')])).toBe('a.py')
    expect(busiest([at(null)])).toBeNull()
  })
})

describe('avatar ink', () => {
  it('is readable on every colour the server gives', () => {
    const lum = (hex: string): number => {
      const lin = (h: string): number => { const c = parseInt(h, 16) / 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4 }
      return 0.2126 * lin(hex.slice(1, 3)) + 0.7152 * lin(hex.slice(3, 5)) + 0.0722 * lin(hex.slice(5, 7))
    }
    const ratio = (a: string, b: string): number => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05) }
    // The server's palette: hue 0..359 at saturation 0.65, lightness 0.42.
    for (let hue = 0; hue < 360; hue++) {
      const c = (1 - Math.abs(2 * 0.42 - 1)) * 0.65
      const x = c * (1 - Math.abs((hue / 60) % 2 - 1))
      const m = 0.42 - c / 2
      const [r, g, b] = hue < 60 ? [c, x, 0] : hue < 120 ? [x, c, 0] : hue < 180 ? [0, c, x] : hue < 240 ? [0, x, c] : hue < 300 ? [x, 0, c] : [c, 0, x]
      const hex = '#' + [r, g, b].map((v) => Math.round((v + m) * 255).toString(16).padStart(2, '0')).join('')
      expect(ratio(hex, inkOn(hex))).toBeGreaterThanOrEqual(4.5)
    }
  })
})
