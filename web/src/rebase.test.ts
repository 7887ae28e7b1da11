import { describe, expect, it } from 'vitest'
import { ChangeSet, Text } from '@codemirror/state'
import { diffChanges, rebase } from './rebase'
import { freePath } from './files'

const apply = (doc: string, c: ChangeSet): string => c.apply(Text.of(doc.split('\n'))).toString()

describe('typing kept through a file\'s departure', () => {
  it('finds what a text gained', () => {
    expect(apply('hello world', diffChanges('hello world', 'hello, dear world'))).toBe('hello, dear world')
    expect(diffChanges('same', 'same').empty).toBe(true)
    expect(apply('abc', diffChanges('abc', ''))).toBe('')
    expect(apply('', diffChanges('', 'xyz'))).toBe('xyz')
  })

  it('puts typing after what the room carried, in order, both ways to one text', () => {
    // The page showed "x = 1 abc" (its own "abc" not yet carried) when the file left; it typed
    // "de" since; the file it became has the carried "abc" and someone's edit at the start.
    const base = 'x = 1 abc'
    const local = ChangeSet.of([{ from: 9, insert: 'de' }], base.length)
    const now = '# top\nx = 1 abc'
    const { toText, toView } = rebase(base, now, local)
    const text = apply(now, toText)
    expect(text).toBe('# top\nx = 1 abcde')
    expect(apply(apply(base, local), toView)).toBe(text)
  })

  it('keeps typing the rename\'s copy had not caught up with yet', () => {
    // The copy lacks "abc" (never carried): the typing is kept after the shared part.
    const base = 'x = 1 abc'
    const local = ChangeSet.of([{ from: 9, insert: 'd' }], base.length)
    const { toText } = rebase(base, 'x = 1 ', local)
    expect(apply('x = 1 ', toText)).toContain('d')
  })
})

describe('a free path', () => {
  it('numbers a taken name before its extension', () => {
    const taken = new Set(['a.txt', 'src/b.rs', 'src/b (2).rs', 'Makefile', '.env'])
    const is = (p: string): boolean => taken.has(p)
    expect(freePath('c.txt', is)).toBe('c.txt')
    expect(freePath('a.txt', is)).toBe('a (2).txt')
    expect(freePath('src/b.rs', is)).toBe('src/b (3).rs')
    expect(freePath('Makefile', is)).toBe('Makefile (2)')
    expect(freePath('.env', is)).toBe('.env (2)')
  })
})
