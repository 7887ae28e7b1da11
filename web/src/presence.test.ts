import { describe, expect, it } from 'vitest'
import { busiest, initials, peers, type Peer } from './presence'

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
