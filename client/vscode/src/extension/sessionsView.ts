// Sessions: the caller's sessions, grouped by project (each workspace folder
// first, then other projects), then those other users share with the caller
// (each with its owner and the caller's role), newest activity first. Opening
// one attaches the chat to it: its whole history, then its live tail.
import * as path from 'node:path';
import * as vscode from 'vscode';
import { SessionInfo, ShareRole, listSessions, shareSession, unshareSession } from '../client';
import type { Chat } from './chat';
import { Connection, shown, staleAfter } from './connection';

type Node =
  | { kind: 'group'; root: string; label: string; sessions: SessionInfo[] }
  | { kind: 'session'; s: SessionInfo };

export function ago(us: number): string {
  const s = Math.max(0, Math.round((Date.now() - us / 1000) / 1000));
  if (s < 60) return 'just now';
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

export class SessionsView implements vscode.TreeDataProvider<Node>, vscode.Disposable {
  private readonly changed = new vscode.EventEmitter<Node | undefined>();
  readonly onDidChangeTreeData = this.changed.event;
  sessions: SessionInfo[] = [];
  private error = '';
  private drawnAs = '';
  private timer: NodeJS.Timeout;
  private disposables: vscode.Disposable[] = [];

  constructor(
    private readonly conn: Connection,
    private readonly chat: Chat,
  ) {
    this.timer = setInterval(() => void this.refresh(), 5000);
    let shown = '';
    this.disposables.push(
      // A new session (or one opened from elsewhere) shows at once; other changes only redraw.
      chat.onDidChange(() => {
        if ((chat.session?.id ?? '') !== shown) {
          shown = chat.session?.id ?? '';
          void this.refresh();
        } else {
          this.redraw();
        }
      }),
      conn.onDidChange(() => conn.state === 'connected' && void this.refresh()),
      // Another daemon or other credentials: nothing listed so far is known to be theirs.
      conn.onDidReset(() => {
        this.sessions = [];
        void this.refresh();
      }),
    );
  }

  async refresh(): Promise<void> {
    try {
      const client = await this.conn.get();
      this.sessions = await listSessions(client, { sharedWithMe: true });
      this.error = '';
      this.conn.noteSuccess();
    } catch (e) {
      this.error = shown(e);
      this.conn.noteFailure(e);
      if (staleAfter(e)) this.sessions = [];
    }
    this.redraw();
  }

  /**
   * Redraws only when what the view shows has changed. A redraw replaces
   * every row's command, and a click that lands on a row just replaced is
   * lost ("Actual command not found"): polling must not redraw for nothing.
   */
  private redraw(): void {
    const now = JSON.stringify([
      this.error,
      this.chat.session?.id ?? '',
      (vscode.workspace.workspaceFolders ?? []).map((f) => f.uri.fsPath),
      this.sessions.map((s) => [
        s.id,
        s.title,
        s.mode,
        s.turn_running,
        ago(s.updated_us),
        s.project_root,
        s.last_seq,
        s.provider,
        s.model,
        s.owner_user,
        s.my_role,
        (s.shares ?? []).map((sh) => [sh.user, sh.role, sh.expired]),
      ]),
    ]);
    if (now === this.drawnAs) return;
    this.drawnAs = now;
    this.changed.fire(undefined);
  }

  /** Shares a session the caller owns (see shareSession); the list shows it at once. */
  async share(sessionId: string, user: string, role: ShareRole, expiresInS = 0) {
    const made = await shareSession(await this.conn.get(), sessionId, user, role, expiresInS);
    await this.refresh();
    return made;
  }

  /** Ends a share; that user's open streams of the session end within a second. */
  async unshare(sessionId: string, user: string): Promise<void> {
    await unshareSession(await this.conn.get(), sessionId, user);
    await this.refresh();
  }

  /** Why the list could not be read, with what to do; '' when it was. The view shows it above the list, wrapped. */
  get message(): string {
    return this.error;
  }

  getChildren(node?: Node): Node[] {
    if (node?.kind === 'group') return node.sessions.map((s) => ({ kind: 'session', s }));
    if (node) return [];
    return this.listed();
  }

  private listed(): Node[] {
    const folders = vscode.workspace.workspaceFolders ?? [];
    const leaf = (list: SessionInfo[]): Node[] => list.map((s) => ({ kind: 'session', s }));
    const own = this.sessions.filter((s) => !isShared(s));
    const shared = this.sessions.filter(isShared);
    const sharedGroup: Node[] = shared.length
      ? [{ kind: 'group', root: SHARED, label: 'Shared with me', sessions: shared }]
      : [];
    const groups: Node[] = [];
    const used = new Set<string>();
    for (const f of folders) {
      const mine = own.filter((s) => isUnder(s.project_root, f.uri.fsPath));
      mine.forEach((s) => used.add(s.id));
      groups.push({ kind: 'group', root: f.uri.fsPath, label: f.name, sessions: mine });
    }
    const rest = own.filter((s) => !used.has(s.id));
    if (!folders.length) return [...leaf(rest), ...sharedGroup];
    // One folder and nothing elsewhere: no grouping level.
    if (folders.length === 1 && !rest.length && !shared.length) return leaf(own);
    if (rest.length) groups.push({ kind: 'group', root: '', label: 'Other projects', sessions: rest });
    return [...groups, ...sharedGroup];
  }

  getTreeItem(node: Node): vscode.TreeItem {
    if (node.kind === 'group') {
      const it = new vscode.TreeItem(node.label, vscode.TreeItemCollapsibleState.Expanded);
      it.description = `${node.sessions.length}`;
      it.tooltip =
        node.root === SHARED
          ? 'Sessions other users share with you: what you may do in each is its role'
          : node.root || 'Sessions of projects outside this workspace';
      it.iconPath = new vscode.ThemeIcon(node.root === SHARED ? 'organization' : 'folder');
      return it;
    }
    const s = node.s;
    const it = new vscode.TreeItem(s.title || s.id, vscode.TreeItemCollapsibleState.None);
    const current = this.chat.session?.id === s.id;
    it.id = s.id;
    const shares = (s.shares ?? []).filter((sh) => !sh.expired);
    const whose = isShared(s) ? `${s.owner_user} · ${s.my_role} · ` : '';
    it.description =
      `${whose}${s.mode}${s.turn_running ? ' · running' : ''} · ${ago(s.updated_us)}` +
      (shares.length ? ` · shared with ${shares.length}` : '');
    it.tooltip = new vscode.MarkdownString(
      `**${s.title || s.id}**\n\n${s.id} · ${s.mode} mode\n\n${s.project_root}\n\n${s.last_seq} events · ${s.provider || 'default provider'} ${s.model}\n\nlast activity ${new Date(s.updated_us / 1000).toLocaleString()}` +
        (isShared(s) ? `\n\n${s.owner_user}'s session, shared with you to ${ROLE_SAYS[s.my_role] ?? s.my_role}` : '') +
        (shares.length ? `\n\nshared with ${shares.map(shareLine).join(', ')}` : ''),
    );
    it.iconPath = new vscode.ThemeIcon(s.turn_running ? 'pulse' : current ? 'comment-discussion' : 'comment');
    // Owned: share, unshare, delete; shared with the caller: open only.
    it.contextValue = isShared(s) ? 'sharedSession' : 'session';
    it.command = { command: 'fwai.attachSession', title: 'Open', arguments: [s.id] };
    if (current) it.description = `● ${it.description}`;
    return it;
  }

  dispose(): void {
    clearInterval(this.timer);
    for (const d of this.disposables) d.dispose();
  }
}

const SHARED = '\0shared';

/** A session another user owns and shares with the caller. */
export function isShared(s: SessionInfo): boolean {
  return !!s.my_role && s.my_role !== 'owner';
}

const ROLE_SAYS: Record<string, string> = {
  watch: 'watch',
  answer: "watch and answer the agent's questions",
  approve: 'watch, answer and approve plans and edits',
  drive: 'watch, answer, approve, send messages, cancel and switch mode',
};

/** "bob (drive, until 18:00)". */
export function shareLine(sh: { user: string; role: string; expires_us: number }): string {
  if (!sh.expires_us) return `${sh.user} (${sh.role})`;
  const at = new Date(sh.expires_us / 1000);
  const hhmm = `${String(at.getHours()).padStart(2, '0')}:${String(at.getMinutes()).padStart(2, '0')}`;
  return `${sh.user} (${sh.role}, until ${hhmm})`;
}

function isUnder(p: string, root: string): boolean {
  const rel = path.relative(root, p);
  return rel === '' || (!rel.startsWith('..') && !path.isAbsolute(rel));
}
