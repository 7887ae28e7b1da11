// The server's HTTP API (shared/spec/api.md). Every call is same-origin with the session cookie;
// errors carry the server's safe message and the status, so screens can say what went wrong.

export type Capability =
  | 'observe' | 'edit' | 'type' | 'approve' | 'invite' | 'connect_repo' | 'add_secret'
  | 'spend' | 'export' | 'publish' | 'revoke' | 'delete'

export const CAPABILITIES: Capability[] = [
  'observe', 'edit', 'type', 'approve', 'invite', 'connect_repo', 'add_secret',
  'spend', 'export', 'publish', 'revoke', 'delete',
]

export interface Me { id: string, email: string, is_admin: boolean, display_name?: string | null }
export interface RoomSummary {
  id: string
  name: string
  role?: string
  /** How many people are in it. */
  members?: number
  /** When something last happened in it (ms). */
  last_activity?: number
  /** Its sandbox's state, null before its first start. */
  sandbox?: string | null
}
export interface Participant { user_id: string, email: string, display_name?: string, role: string, capabilities: Capability[] }
export interface Room {
  id: string
  name: string
  /** A deletion waiting for an admin (`pending_confirmation`) or under way (`confirmed`). */
  pending_deletion?: { id: string, state: string, requested_by: string, requested_by_email: string | null } | null
  participants: Participant[]
  my_capabilities: Capability[]
  sandbox: SandboxStatus | null
  /** A fork's parentage; null for a room made from scratch. */
  parent?: Parentage | null
  /** The command the sandbox runs after every start, if any. */
  readiness?: string | null
  checkpoint_policy?: CheckpointPolicy
  /** Whether adding a secret needs someone else's approval. */
  secrets_need_approval?: boolean
  /** Agents type in the terminal only while someone who holds approve is in the room. */
  moderated?: boolean
  /** The room's secrets by rule (never by value). */
  secret_rules?: { name: string, hosts: string[] }[]
  /** Agents in the room now. */
  agents?: AgentInfo[]
}
/** An agent: sponsored by a person, holding what it was given that its sponsor holds. */
export interface AgentInfo {
  agent_id: string
  name: string
  sponsor: string
  sponsor_email: string
  capabilities: Capability[]
  approval_mode: boolean
  expires_at: number
}
export interface CheckpointPolicy {
  every_s: number | null
  keep_days: number | null
  next_at: number | null
  restore_needs_approval: boolean
}
export interface Parentage {
  room: string
  checkpoint: string
  chain_head: string
  /** What of the parent's authority the fork did not take, by kind. */
  dropped?: Record<string, number>
}
/** The room's readiness step in the running sandbox. */
export type Readiness =
  | { state: 'none' }
  | { state: 'preparing', command: string, since: number }
  | { state: 'ready', command: string, at: number, skipped: boolean }
  | { state: 'failed', command: string, at: number, exit_code: number | null, timed_out: boolean, output: string }
export interface SecretRule {
  name: string
  hosts: string[]
  header: string
  format: string
  created_by: string
  created_at: number
  last_used_at: number | null
}
export interface Tally { connections: number, bytes_out: number, bytes_in: number }
export interface Egress {
  allow: string[]
  presets: string[]
  available_presets: { name: string, label: string, hosts: string[] }[]
  recent_denied: { at: number, host: string, port: number, reason: string }[]
  totals: Record<string, { allowed: Tally, denied: Tally, model_tokens: { input: number, output: number } }>
}
export interface Repo {
  id: string
  url: string
  branch: string
  secret: string | null
  access: 'read' | 'push'
  path: string
  base: string
  created_by: string
  created_at: number
}
/** An answer that may instead be a request for someone else's approval. */
export interface Gated { state?: string, approval_id?: string }
/** A file deleted from the room's document, waiting in its trash. */
export interface Trashed {
  id: string
  path: string
  bytes: number
  deleted_by: string
  /** Who deleted it, in words (an email, or an agent's name). */
  deleted_by_name: string
  deleted_at: number
}

export const METERS = ['sandbox_seconds', 'execs', 'egress_bytes', 'model_tokens', 'tool_calls'] as const
export type Meter = typeof METERS[number]
export type Limits = Partial<Record<Meter, number>>
export interface SpendView {
  budget: Limits | null
  used: Record<Meter, number>
  remaining: Limits
  by_tier: Record<string, number>
  participants: Array<{ who: string, kind: 'person' | 'agent' | 'sandbox' | 'code', name: string, used: Record<Meter, number>, budget: Limits | null }>
}
export interface Checkpoint { id: string, name: string, author: string, at: number, bytes: number, scheduled?: boolean }
export interface SandboxStatus {
  tier: string
  tier_reason?: string
  state: string
  reason?: string
  limits?: Record<string, unknown>
  receipt?: Record<string, unknown> | null
  snapshot_at?: number | null
  resumed_from?: number | null
  idle_stop_at?: number | null
  usage?: Record<string, unknown> | null
  /** Text files of the workspace in the document, the cap, and those left out past it. */
  file_sync?: { files: number, cap: number, not_mirrored: number }
  readiness?: Readiness
}
export interface Approval {
  id: string
  action: string
  params: unknown
  requester: string
  state: string
  decided_by: string | null
  created_at: number
  expires_at: number
}
export interface AuditRecord {
  seq: number
  at: number
  actor: string
  /** The actor's email, when the actor is an account (a removed one too). */
  actor_email?: string
  /** The name the actor chose to be shown by, when they did. */
  actor_name?: string
  /** When the actor is one of the room's agents (a revoked one too): its name and sponsor. */
  actor_agent?: { name: string, sponsor_email?: string | null }
  /** The email of the account `details.target` names. */
  target_email?: string
  action: string
  decision: string
  reason: string
  details: unknown
  details_json?: string
  prev_hash: string
  hash: string
}
export interface Receipt {
  deletion_id?: string
  room_id?: string
  complete?: boolean
  artifacts?: { artifact: string, status: string, count: number }[]
  [k: string]: unknown
}
export interface Deletion { deletion_id?: string, state?: string, receipt: Receipt }

/** An account as the admin console lists it. */
export interface AdminUser {
  id: string
  email: string
  created_at: number
  last_login: number | null
  rooms: { id: string, name: string, role: string }[]
  /** When it was revoked everywhere (null: it may log in). */
  revoked_at: number | null
}

/** A room deletion as the admin console lists it. */
export interface AdminDeletion {
  id: string
  room_id: string
  room_name: string | null
  state: string
  requested_by: string
  requested_by_email: string | null
  requested_at: number
  confirmed_by: string | null
  confirmed_at: number | null
}

/** A port of the room's sandbox served on the preview origin. */
export interface Preview {
  id: string
  port: number
  visibility: 'room' | 'public'
  state: 'active' | 'pending_approval' | 'expired' | 'revoked'
  approval_id: string | null
  ttl_ms: number
  created_by: string
  created_at: number
  expires_at: number
  hits: number
  /** The preview's address (a room preview's needs a one-time link from `openPreview`). */
  url: string | null
}

/** What an invite link offers (`GET /api/invites/{token}`). */
export interface InviteShown {
  room_id: string
  room_name: string
  invited_by: string | null
  role: string
  expires_at: number
  uses_left: number
  /** What it grants (its role's, or those chosen). */
  capabilities?: Capability[]
  /** The one address that may accept it, when it was sent to one. */
  email?: string
}

export class ApiError extends Error {
  /** `retryAfterS`: the server's Retry-After (seconds), when it said one. */
  constructor (readonly status: number, message: string, readonly retryAfterS: number | null = null) {
    super(message)
  }
}

/** The server's message for a failed call, or a plain description of the status. */
async function failure (res: Response): Promise<ApiError> {
  let message = `${res.status} ${res.statusText}`
  try {
    const body = await res.json() as { error?: string, message?: string, reason?: string }
    message = body.error ?? body.message ?? body.reason ?? message
  } catch { /* not JSON: keep the status line */ }
  if (res.status === 429) message = `Too many attempts; wait a moment and try again (${message})`
  const after = Number(res.headers.get('retry-after') ?? '')
  return new ApiError(res.status, message, Number.isFinite(after) && after > 0 ? after : null)
}

export async function call<T> (method: string, path: string, body?: unknown): Promise<T> {
  let res: Response
  try {
    res = await fetch(path, {
      method,
      credentials: 'same-origin',
      headers: body === undefined ? {} : { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    })
  } catch {
    throw new ApiError(0, 'The server cannot be reached; check your connection')
  }
  if (!res.ok) throw await failure(res)
  if (res.status === 204 || res.status === 202 && res.headers.get('content-length') === '0') return undefined as T
  const text = await res.text()
  return (text ? JSON.parse(text) : undefined) as T
}

/** A POST answered with a file once approved (200), else with the approval request (202). */
async function postForFile (url: string, body: unknown): Promise<Blob | Gated> {
  const res = await fetch(url, {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  }).catch(() => { throw new ApiError(0, 'The server cannot be reached; check your connection') })
  if (!res.ok) throw await failure(res)
  return res.status === 202 ? await res.json() as Gated : await res.blob()
}

/** An export of a repository's changes: the file once approved, else the approval request. */
export async function exportRepo (id: string, rid: string, format: 'bundle' | 'patch', approval_id?: string): Promise<Blob | Gated> {
  return await postForFile(`/api/rooms/${id}/repos/${rid}/export`, approval_id ? { format, approval_id } : { format })
}

/** The whole workspace as a .tar.gz once approved, else the approval request. */
export async function exportWorkspace (id: string, approval_id?: string): Promise<Blob | Gated> {
  return await postForFile(`/api/rooms/${id}/exports`, approval_id ? { workspace: true, approval_id } : { workspace: true })
}

export const api = {
  me: () => call<Me>('GET', '/api/me'),
  setDisplayName: (display_name: string | null) => call<Me>('PUT', '/api/me', { display_name }),
  requestCode: (email: string) => call<void>('POST', '/api/auth/code', { email }),
  verify: (email: string, code: string) => call<{ user: { id: string, email: string } }>('POST', '/api/auth/verify', { email, code }),
  logout: () => call<void>('POST', '/api/auth/logout'),
  rooms: () => call<RoomSummary[] | { rooms: RoomSummary[] }>('GET', '/api/rooms'),
  createRoom: (name: string) => call<{ id: string }>('POST', '/api/rooms', { name }),
  room: (id: string) => call<Room>('GET', `/api/rooms/${id}`),
  invite: (id: string, role: string, ttl_s: number, max_uses: number, more: { capabilities?: Capability[], email?: string } = {}) =>
    call<{ token: string, url: string, sent_to?: string }>('POST', `/api/rooms/${id}/invites`, { role, ttl_s, max_uses, ...more }),
  showInvite: (token: string) => call<InviteShown>('GET', `/api/invites/${encodeURIComponent(token)}`),
  acceptInvite: (token: string) => call<{ room_id: string }>('POST', `/api/invites/${encodeURIComponent(token)}/accept`),
  revokeInvite: (token: string) => call<void>('DELETE', `/api/invites/${encodeURIComponent(token)}`),
  changeParticipant: (id: string, user: string, change: { role?: string, grant?: Capability[], revoke?: Capability[] }) =>
    call<unknown>('PATCH', `/api/rooms/${id}/participants/${user}`, change),
  removeParticipant: (id: string, user: string) => call<void>('DELETE', `/api/rooms/${id}/participants/${user}`),
  approvals: (id: string) => call<Approval[] | { approvals: Approval[] }>('GET', `/api/rooms/${id}/approvals`),
  decide: (id: string, approval: string, approve: boolean) =>
    call<unknown>('POST', `/api/rooms/${id}/approvals/${approval}/decision`, { approve }),
  exportFiles: (id: string, files: string[], approval_id?: string) =>
    call<{ approval_id?: string, state?: string, files?: unknown }>('POST', `/api/rooms/${id}/exports`, { files, approval_id }),
  audit: (id: string) => call<AuditRecord[]>('GET', `/api/rooms/${id}/audit`),
  sandbox: (id: string) => call<SandboxStatus>('GET', `/api/rooms/${id}/sandbox`),
  sandboxStop: (id: string) => call<SandboxStatus>('POST', `/api/rooms/${id}/sandbox/stop`),
  sandboxStart: (id: string) => call<SandboxStatus>('POST', `/api/rooms/${id}/sandbox/start`),
  trash: (id: string) => call<Trashed[]>('GET', `/api/rooms/${id}/trash`),
  restoreTrashed: (id: string, tid: string) => call<{ path: string }>('POST', `/api/rooms/${id}/trash/${tid}/restore`),
  checkpoints: (id: string) => call<Checkpoint[]>('GET', `/api/rooms/${id}/checkpoints`),
  checkpoint: (id: string, name: string) => call<Checkpoint>('POST', `/api/rooms/${id}/checkpoints`, { name }),
  restore: (id: string, checkpoint: string, approval_id?: string) =>
    call<{ state?: string, approval_id?: string }>('POST', `/api/rooms/${id}/checkpoints/${checkpoint}/restore`,
      approval_id ? { approval_id } : undefined),
  setCheckpointPolicy: (id: string, p: { every_s: number | null, keep_days: number | null, restore_needs_approval: boolean }) =>
    call<CheckpointPolicy>('PUT', `/api/rooms/${id}/checkpoint-policy`, p),
  fork: (id: string, checkpoint: string | null, approval_id?: string) =>
    call<{ id?: string, name?: string, parent?: Parentage, state?: string, approval_id?: string }>('POST', `/api/rooms/${id}/fork`, { checkpoint, approval_id }),
  secrets: (id: string) => call<SecretRule[]>('GET', `/api/rooms/${id}/secrets`),
  addSecret: (id: string, s: { name: string, value: string, hosts: string[], header: string, format: string, approval_id?: string }) =>
    call<SecretRule & Gated>('POST', `/api/rooms/${id}/secrets`, s),
  setModerated: (id: string, moderated: boolean) => call<unknown>('PUT', `/api/rooms/${id}/moderation`, { moderated }),
  setSecretsPolicy: (id: string, add_needs_approval: boolean) =>
    call<{ add_needs_approval: boolean }>('PUT', `/api/rooms/${id}/secrets-policy`, { add_needs_approval }),
  removeSecret: (id: string, name: string) => call<void>('DELETE', `/api/rooms/${id}/secrets/${encodeURIComponent(name)}`),
  egress: (id: string) => call<Egress>('GET', `/api/rooms/${id}/egress`),
  spend: (id: string) => call<SpendView>('GET', `/api/rooms/${id}/spend`),
  setBudget: (id: string, b: { budget: Limits | null, agent_id?: string, approval_id?: string }) =>
    call<SpendView & Gated>('PUT', `/api/rooms/${id}/budget`, b),
  setEgress: (id: string, p: { allow: string[], presets: string[] }) => call<Egress>('PUT', `/api/rooms/${id}/egress`, p),
  allowEgress: (id: string, rule: string, approval_id?: string) =>
    call<Egress & Gated>('POST', `/api/rooms/${id}/egress/allow`, approval_id ? { rule, approval_id } : { rule }),
  createAgent: (id: string, a: { name: string, capabilities: Capability[], ttl_s: number, approval_mode: boolean }) =>
    call<AgentInfo & { token: string }>('POST', `/api/rooms/${id}/agents`, a),
  revokeAgent: (id: string, agent: string) => call<void>('DELETE', `/api/rooms/${id}/agents/${agent}`),
  previews: (id: string) => call<Preview[]>('GET', `/api/rooms/${id}/previews`),
  createPreview: (id: string, p: { port: number, visibility: 'room' | 'public', ttl_s: number }) =>
    call<Preview>('POST', `/api/rooms/${id}/previews`, p),
  openPreview: (id: string, pid: string) => call<{ url: string, state: string }>('POST', `/api/rooms/${id}/previews/${pid}/open`, {}),
  revokePreview: (id: string, pid: string) => call<void>('DELETE', `/api/rooms/${id}/previews/${pid}`),
  ports: (id: string) => call<{ running: boolean, listening: number[], previews?: boolean }>('GET', `/api/rooms/${id}/sandbox/ports`),
  repos: (id: string) => call<Repo[]>('GET', `/api/rooms/${id}/repos`),
  connectRepo: (id: string, r: { url: string, branch: string, secret: string | null, access: string, path?: string }) =>
    call<Repo & { skipped: string[] }>('POST', `/api/rooms/${id}/repos`, r),
  pullRepo: (id: string, rid: string) =>
    call<{ state: string, merged?: boolean, skipped?: string[] }>('POST', `/api/rooms/${id}/repos/${rid}/pull`, {}),
  pushRepo: (id: string, rid: string, message: string, force = false, approval_id?: string) =>
    call<{ state: string, commit?: string } & Gated>('POST', `/api/rooms/${id}/repos/${rid}/push`,
      approval_id ? { message, force, approval_id } : { message, force }),
  disconnectRepo: (id: string, rid: string) => call<void>('DELETE', `/api/rooms/${id}/repos/${rid}`),
  setReadiness: (id: string, command: string | null) => call<{ command: string | null }>('PUT', `/api/rooms/${id}/readiness`, { command }),
  requestDeletion: (id: string) => call<{ deletion_id: string, state: string }>('DELETE', `/api/rooms/${id}`),
  deletion: (id: string) => call<Deletion>('GET', `/api/deletions/${id}`),
  adminUsers: (q: string) => call<AdminUser[]>('GET', `/api/admin/users?q=${encodeURIComponent(q)}`),
  revokeUser: (id: string) => call<{ user_id: string, email: string, rooms: string[], sessions: number }>('POST', `/api/admin/users/${id}/revoke`),
  restoreUser: (id: string) => call<{ user_id: string, email: string }>('POST', `/api/admin/users/${id}/restore`),
  adminDeletions: () => call<AdminDeletion[]>('GET', '/api/admin/deletions'),
  adminAudit: () => call<AuditRecord[]>('GET', '/api/admin/audit'),
  confirmDeletion: (id: string) => call<Deletion>('POST', `/api/deletions/${id}/confirm`),
}

/** The WebSocket URL of an API path on this origin (`wss:` under https). */
export function wsUrl (path: string): string {
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:'
  return `${proto}//${location.host}${path}`
}

/** Lists come bare or wrapped (`{"rooms": [...]}`); either way, the array. */
export function list<T> (v: T[] | Record<string, T[]>): T[] {
  if (Array.isArray(v)) return v
  const first = Object.values(v).find(Array.isArray)
  return first ?? []
}
