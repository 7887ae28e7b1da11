// The sandbox panel's words for what the server reports.

/** The microVM tier's receipt in plain words: which VMM, how it runs, which guest. */
export function vmSentence (receipt: Record<string, unknown> | null | undefined): string | null {
  const vm = receipt?.vm as Record<string, unknown> | undefined
  if (vm == null) return null
  const vmm = vm.vmm === 'cloud-hypervisor' ? 'cloud-hypervisor' : 'QEMU'
  const how = vm.accel === 'kvm' ? 'hardware virtualisation (KVM)' : 'software emulation (slower than the host)'
  const disk = typeof vm.disk_bytes === 'number' ? `${Math.round(vm.disk_bytes / 1048576)} MiB` : 'its own'
  return `Runs in its own virtual machine: ${vmm} ${String(vm.vmm_version ?? '')} with ${how}, ` +
    `guest kernel ${String(vm.guest_kernel ?? '?')}, guest image ${String(vm.image ?? '').slice(0, 12)}, ` +
    `a ${disk} workspace disk, no network device.`
}


/** A size in bytes as people read it: "1 GiB", "1.5 GiB", "512 MiB", "800 KiB", "12 bytes". */
export function bytesText (n: number): string {
  const units = ['bytes', 'KiB', 'MiB', 'GiB', 'TiB']
  let v = n
  let u = 0
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++ }
  const shown = u === 0 || Number.isInteger(v) ? String(v) : v >= 10 ? String(Math.round(v)) : String(Math.round(v * 10) / 10)
  return `${shown} ${units[u]}`
}

/** CPU in thousandths of a core as words: "1 core", "half a core", "0.25 of a core", "2 cores". */
export function cpuText (millis: number): string {
  if (millis === 500) return 'half a core'
  const cores = millis / 1000
  if (cores === 1) return '1 core'
  if (cores < 1) return `${cores} of a core`
  return `${cores} cores`
}

const LIMIT_WORDS: Record<string, [string, (v: number) => string]> = {
  memory_bytes: ['Memory (the workspace and /tmp included)', bytesText],
  workspace_bytes: ['Workspace disk', bytesText],
  cpu_millis: ['CPU', cpuText],
  pids: ['Programs and threads at once', (v) => String(v)],
}

const USAGE_WORDS: Record<string, string> = {
  oom_kills: 'Programs stopped for want of memory',
  forks_refused: 'Programs refused (too many at once)',
}

/** Words for a key the panel has no phrase for: `max_open_files` -> "Max open files". */
function keyWords (k: string): string {
  const w = k.replace(/_bytes$/, '').replace(/_/g, ' ')
  return w.charAt(0).toUpperCase() + w.slice(1)
}

function valueText (k: string, v: unknown): string {
  if (typeof v === 'number') return k.endsWith('_bytes') ? bytesText(v) : v.toLocaleString('en')
  if (Array.isArray(v)) return v.map((x) => valueText('', x)).join(', ')
  if (v !== null && typeof v === 'object') return Object.entries(v).map(([a, b]) => `${keyWords(a)}: ${valueText(a, b)}`).join('; ')
  return String(v)
}

/** The sandbox's limits as rows of [what, how much], in plain words and human units. */
export function limitRows (limits: Record<string, unknown> | null | undefined): Array<[string, string]> {
  if (!limits) return []
  return Object.entries(limits).map(([k, v]) => {
    const known = LIMIT_WORDS[k]
    return known && typeof v === 'number' ? [known[0], known[1](v)] : [keyWords(k), valueText(k, v)]
  })
}

/** What the sandbox ran into (memory, processes) as rows of [what, how many]. */
export function usageRows (usage: Record<string, unknown> | null | undefined): Array<[string, string]> {
  if (!usage) return []
  return Object.entries(usage).map(([k, v]) => [USAGE_WORDS[k] ?? keyWords(k), valueText(k, v)])
}

const RECEIPT_WORDS: Record<string, string> = {
  implementation: 'Made with',
  network: 'Network',
  seccomp: 'System calls',
  cgroups: 'Resource limits by',
  host_uid: 'Runs on the host as user',
  mounts: 'Files it sees',
  host: 'On sandbox host',
}

/** The receipt (what the sandbox was started with) as rows of [what, value], for "details". */
export function receiptRows (receipt: Record<string, unknown> | null | undefined): Array<[string, string]> {
  if (!receipt) return []
  const rows: Array<[string, string]> = []
  for (const [k, v] of Object.entries(receipt)) {
    if (k === 'tier' || k === 'vm') continue // said in the sentence above the details
    if (k === 'limits') continue // the Limits table
    const text = Array.isArray(v) ? v.map(String).join('\n') : k === 'host_uid' ? String(v) : valueText(k, v)
    rows.push([RECEIPT_WORDS[k] ?? keyWords(k), text])
  }
  return rows
}
