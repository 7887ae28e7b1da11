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

