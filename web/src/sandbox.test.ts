import { describe, expect, it } from 'vitest'
import { bytesText, cpuText, limitRows, receiptRows, usageRows } from './sandbox'

describe('the sandbox panel in plain words', () => {
  it('says sizes in human units', () => {
    expect(bytesText(1073741824)).toBe('1 GiB')
    expect(bytesText(536870912)).toBe('512 MiB')
    expect(bytesText(1610612736)).toBe('1.5 GiB')
    expect(bytesText(819200)).toBe('800 KiB')
    expect(bytesText(12)).toBe('12 bytes')
    expect(bytesText(0)).toBe('0 bytes')
  })

  it('says CPU in cores', () => {
    expect(cpuText(1000)).toBe('1 core')
    expect(cpuText(500)).toBe('half a core')
    expect(cpuText(250)).toBe('0.25 of a core')
    expect(cpuText(2000)).toBe('2 cores')
  })

  it('turns the limits, what the sandbox ran into and the receipt into rows without raw numbers or JSON', () => {
    expect(limitRows({ memory_bytes: 1 << 30, pids: 512, cpu_millis: 1000, workspace_bytes: 512 << 20 })).toEqual([
      ['Memory (the workspace and /tmp included)', '1 GiB'],
      ['Programs and threads at once', '512'],
      ['CPU', '1 core'],
      ['Workspace disk', '512 MiB'],
    ])
    expect(limitRows({ swap_bytes: 2048 })).toEqual([['Swap', '2 KiB']])
    expect(usageRows({ oom_kills: 2, forks_refused: 0 })).toEqual([
      ['Programs stopped for want of memory', '2'],
      ['Programs refused (too many at once)', '0'],
    ])
    const rows = receiptRows({
      tier: 'namespace', implementation: 'bubblewrap 0.8', mounts: ['/workspace rw', '/usr ro'],
      limits: { memory_bytes: 1 }, network: 'none', host_uid: 100000,
    })
    expect(rows).toEqual([
      ['Made with', 'bubblewrap 0.8'],
      ['Files it sees', '/workspace rw\n/usr ro'],
      ['Network', 'none'],
      ['Runs on the host as user', '100000'],
    ])
    // A sandbox on a sandbox host names it (by its name, never an address).
    expect(receiptRows({ tier: 'namespace', host: 'node-7' })).toEqual([['On sandbox host', 'node-7']])
    for (const [, v] of [...rows, ...limitRows({ memory_bytes: 1 << 30 })]) {
      expect(v).not.toMatch(/[{}]|1073741824/)
    }
  })
})
