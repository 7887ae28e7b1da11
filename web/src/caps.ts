// What the interface offers a participant. The server decides every action again; these only
// keep people from being shown buttons that can only fail.

import type { Capability, Participant } from './api'

export const ROLES: Record<string, Capability[]> = {
  owner: ['observe', 'edit', 'type', 'approve', 'invite', 'connect_repo', 'add_secret', 'spend', 'export', 'publish', 'revoke', 'delete'],
  editor: ['observe', 'edit', 'type'],
  viewer: ['observe'],
}

export interface Abilities {
  edit: boolean
  type: boolean
  invite: boolean
  approve: boolean
  revoke: boolean
  delete: boolean
  /** Fork the room (a fork copies its files out). */
  export: boolean
  /** Add and remove the room's secrets. */
  addSecret: boolean
  /** Serve a port of the sandbox as a preview (public ones also need someone's approval). */
  publish: boolean
  /** Set budgets (a raise also needs someone's approval) and, in a budgeted room, run metered work. */
  spend: boolean
  /** Capabilities this person could grant to another (only what they hold themselves). */
  grantable: Capability[]
  /** Roles this person could invite with (never more than they hold). */
  inviteRoles: string[]
}

export function abilities (mine: readonly Capability[]): Abilities {
  const has = (c: Capability): boolean => mine.includes(c)
  return {
    // `type` is effective only with `edit` (typing can change every file).
    edit: has('edit'),
    type: has('type') && has('edit'),
    invite: has('invite'),
    approve: has('approve'),
    revoke: has('revoke'),
    delete: has('delete'),
    export: has('export'),
    addSecret: has('add_secret'),
    publish: has('publish'),
    spend: has('spend'),
    grantable: mine.filter((c) => c !== 'observe'),
    inviteRoles: has('invite') ? Object.keys(ROLES).filter((r) => ROLES[r].every(has)) : [],
  }
}

/** Roles the actor may set on `target`: raising needs every capability of the new role, lowering
 *  needs `revoke`; owners cannot be touched by non-owners. */
export function settableRoles (mine: readonly Capability[], target: Participant, selfId: string, targetId: string): string[] {
  if (selfId === targetId) return []
  const has = (c: Capability): boolean => mine.includes(c)
  return Object.keys(ROLES).filter((role) => {
    if (role === target.role) return false
    const gains = ROLES[role].filter((c) => !target.capabilities.includes(c))
    const loses = target.capabilities.filter((c) => !ROLES[role].includes(c))
    return gains.every(has) && (loses.length === 0 || has('revoke'))
  })
}

export function canRemove (mine: readonly Capability[], selfId: string, targetId: string): boolean {
  return mine.includes('revoke') && selfId !== targetId
}
