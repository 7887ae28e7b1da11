import { describe, expect, it } from 'vitest'
import { normalizeCode } from './login'

describe('a login code as typed or pasted', () => {
  it('keeps its six digits whatever the spacing', () => {
    expect(normalizeCode('123456')).toBe('123456')
    expect(normalizeCode('123 456')).toBe('123456')
    expect(normalizeCode(' 123-456 ')).toBe('123456')
    expect(normalizeCode('1 2 3 4 5 6')).toBe('123456')
  })
  it('is refused when it is not six digits', () => {
    expect(normalizeCode('12345')).toBeNull()
    expect(normalizeCode('1234567')).toBeNull()
    expect(normalizeCode('12345a')).toBeNull()
    expect(normalizeCode('')).toBeNull()
  })
})
