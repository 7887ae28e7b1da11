// The Repositories panel: the room's connected repositories (where their files are, the commit
// they are in step with), pull and push, connecting one with a room secret as its credential,
// and disconnecting. The server does the git work: the token never reaches the page or the
// sandbox.

import { api, exportRepo, list, type Approval, type Repo, type Room } from '../api'
import { abilities } from '../caps'
import { action, h, replace, toast, when } from '../dom'
import { download } from './panels'

export async function reposPanel (el: HTMLElement, room: Room, selfId: string, refresh: () => void): Promise<void> {
  const repos = await api.repos(room.id)
  const can = abilities(room.my_capabilities)
  const canConnect = room.my_capabilities.includes('connect_repo')
  const by = (id: string): string => room.participants.find((p) => p.user_id === id)?.email ?? id

  const row = (r: Repo): HTMLElement => {
    const message = h('input', { type: 'text', placeholder: 'Commit message', 'aria-label': `Commit message for ${r.path}`, 'data-testid': `push-message-${r.path}`, maxlength: 10000 })
    const push = async (force: boolean): Promise<void> => {
      const m = message.value.trim()
      if (!m) { toast('A push needs a commit message.', 'error'); return }
      // A forced push uses an approval already given to me for exactly this push.
      const approved = force
        ? list<Approval>(await api.approvals(room.id)).find((a) => a.action === 'force_push' && a.state === 'approved' &&
          a.requester === selfId && (a.params as { repo?: string, message?: string } | null)?.repo === r.id &&
          (a.params as { message?: string } | null)?.message === m)
        : undefined
      const out = await api.pushRepo(room.id, r.id, m, force, approved?.id)
      toast(out.state === 'pending_approval'
        ? 'A forced push needs someone else\'s approval (Approvals panel); push again once it is given.'
        : out.state === 'nothing_to_push' ? 'Nothing to push: the files match the last commit.' : `Pushed ${out.commit?.slice(0, 10) ?? ''}.`)
      refresh()
    }
    return h('li', { class: 'approval', 'data-testid': `repo-${r.path}` },
      h('div', null, h('strong', null, r.path), ' ← ', h('code', null, `${r.url} (${r.branch})`)),
      h('div', { class: 'hint' }, `${r.access === 'push' ? 'read and push' : 'read only'} · credential: ${r.secret ?? 'none'} · in step with ${r.base.slice(0, 10)} · connected ${when(r.created_at)} by ${by(r.created_by)}`),
      can.edit
        ? h('div', { class: 'row' },
          action('Pull', async () => {
            const out = await api.pullRepo(room.id, r.id)
            toast(out.state === 'up_to_date' ? 'Already up to date.' : out.merged ? 'Pulled and merged with the room\'s changes.' : 'Pulled.')
            refresh()
          }, { 'data-testid': `pull-${r.path}` }),
          r.access === 'push' ? [message, action('Push', () => push(false), { class: 'primary', 'data-testid': `push-${r.path}` }),
            action('Force push…', () => push(true), { class: 'danger', 'data-testid': `force-push-${r.path}` })] : null)
        : null,
      room.my_capabilities.includes('export')
        ? h('div', { class: 'row' }, (['bundle', 'patch'] as const).map((format) => action(`Export as a ${format}`, async () => {
          const out = await exportRepo(room.id, r.id, format)
          if (out instanceof Blob) {
            download(`${r.path.replace(/\//g, '-')}.${format}`, out)
          } else {
            toast('An export needs someone else\'s approval (Approvals panel); download it there once given.')
          }
          refresh()
        }, { 'data-testid': `export-${format}-${r.path}` })))
        : null,
      canConnect
        ? action('Disconnect', async () => { await api.disconnectRepo(room.id, r.id); toast(`${r.path} disconnected (its files stay).`); refresh() }, { class: 'danger', 'data-testid': `disconnect-${r.path}` })
        : null)
  }

  const url = h('input', { type: 'url', placeholder: 'https://git.example.com/team/app.git', 'aria-label': 'Repository URL', 'data-testid': 'repo-url' })
  const branch = h('input', { type: 'text', value: 'main', 'aria-label': 'Branch', 'data-testid': 'repo-branch', class: 'short' })
  const secret = h('select', { 'aria-label': 'Credential (a room secret)', 'data-testid': 'repo-secret' },
    h('option', { value: '' }, 'no credential (public)'),
    (room.secret_rules ?? []).map((s) => h('option', { value: s.name }, `${s.name} (${s.hosts.join(', ')})`)))
  const access = h('select', { 'aria-label': 'Access', 'data-testid': 'repo-access' },
    h('option', { value: 'read' }, 'read'), h('option', { value: 'push' }, 'read and push'))
  const path = h('input', { type: 'text', placeholder: 'folder (default: its name)', 'aria-label': 'Folder in the workspace', 'data-testid': 'repo-path' })
  const connect = canConnect
    ? h('section', { class: 'stack' },
      h('h3', null, 'Connect a repository'),
      h('p', { class: 'hint' }, 'The server clones it with the secret you pick (add the token in Secrets first, with the git host as its host) and puts its files in the workspace. The token never enters the sandbox.'),
      url, h('div', { class: 'row' }, branch, access), secret, path,
      action('Connect', async () => {
        const r = await api.connectRepo(room.id, {
          url: url.value.trim(),
          branch: branch.value.trim(),
          secret: secret.value || null,
          access: access.value,
          ...(path.value.trim() ? { path: path.value.trim() } : {}),
        })
        toast(`Connected: its files are in ${r.path}.${r.skipped.length ? ` Left out (too big): ${r.skipped.join(', ')}.` : ''}`)
        refresh()
      }, { class: 'primary', 'data-testid': 'repo-connect' }))
    : h('p', { class: 'hint' }, 'Connecting repositories needs connect_repo.')

  replace(el,
    h('div', { class: 'panel-head' }, h('h2', null, 'Repositories'), action('Refresh', refresh)),
    repos.length ? h('ul', { class: 'approvals' }, repos.map(row)) : h('p', { class: 'hint' }, 'No repositories.'),
    connect)
}
