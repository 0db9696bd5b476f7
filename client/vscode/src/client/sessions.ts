// The caller's sessions (Sessions.List, Get, Create, Delete): what the
// Sessions view lists and the chat opens. A session's live stream is
// SessionStream (session.ts).
import { FwaiClient } from './connection';
import { SessionInfo } from './events';

/**
 * The caller's sessions (`all`: every owner's, for an admin; `sharedWithMe`:
 * also those other users share with the caller, each with its `owner_user`
 * and the caller's `my_role`), newest activity first.
 */
export async function listSessions(
  client: FwaiClient,
  o: { all?: boolean; sharedWithMe?: boolean } = {},
): Promise<SessionInfo[]> {
  const r = await client.call('Sessions', 'List', { all: !!o.all, shared_with_me: !!o.sharedWithMe });
  return r.sessions.sort((a, b) => b.updated_us - a.updated_us);
}

/** What a share lets its user do, each role also what the ones before it may. */
export const SHARE_ROLES = ['watch', 'answer', 'approve', 'drive'] as const;
export type ShareRole = (typeof SHARE_ROLES)[number];

/**
 * Shares a session the caller owns with `user` (a configured user, a local
 * account, a token's user, or `role:NAME`); a second share for the same user
 * replaces the first. `expiresInS` 0: until unshared.
 */
export function shareSession(client: FwaiClient, sessionId: string, user: string, role: ShareRole, expiresInS = 0) {
  return client.call('Sessions', 'Share', { session_id: sessionId, user, role, expires_in_s: expiresInS });
}

/** Ends a share; that user's open streams of the session end within a second. */
export async function unshareSession(client: FwaiClient, sessionId: string, user: string): Promise<void> {
  await client.call('Sessions', 'Unshare', { session_id: sessionId, user });
}

export function getSession(client: FwaiClient, sessionId: string): Promise<SessionInfo> {
  return client.call('Sessions', 'Get', { session_id: sessionId });
}

export interface NewSession {
  /** Absolute path of the project the session works on. */
  projectRoot: string;
  title?: string;
  /** '' : the daemon's default provider, and that provider's model. */
  provider?: string;
  model?: string;
  mode?: 'act' | 'plan';
  /** The agent's write_file / edit_file wait for the user's accept. */
  askBeforeEdits?: boolean;
}

export function createSession(client: FwaiClient, o: NewSession): Promise<SessionInfo> {
  return client.call('Sessions', 'Create', {
    title: o.title ?? '',
    project_root: o.projectRoot,
    provider: o.provider ?? '',
    model: o.model ?? '',
    mode: o.mode ?? 'act',
    ask_before_edits: !!o.askBeforeEdits,
  });
}

/** Deletes a session and its history. */
export async function deleteSession(client: FwaiClient, sessionId: string): Promise<void> {
  await client.call('Sessions', 'Delete', { session_id: sessionId });
}

/** The checkpoints of a session, oldest first: its project and boards before each turn. */
export async function listCheckpoints(client: FwaiClient, sessionId: string) {
  const r = await client.call('Sessions', 'ListCheckpoints', { session_id: sessionId });
  return r.checkpoints;
}

export interface RewindOptions {
  /** A checkpoint's number or the turn id it precedes; '' : the latest. */
  to?: string;
  files?: boolean;
  boards?: boolean;
  conversation?: boolean;
  dryRun?: boolean;
  /** Only these files (relative to the project), each one the rewind would change. */
  paths?: string[];
}

/** Rewinds a session (or, with dryRun, says what a rewind would change). */
export function rewindSession(client: FwaiClient, sessionId: string, o: RewindOptions = {}) {
  return client.call('Sessions', 'Rewind', {
    session_id: sessionId,
    to: o.to ?? '',
    files: o.files ?? true,
    boards: o.boards ?? true,
    conversation: !!o.conversation,
    dry_run: !!o.dryRun,
    paths: o.paths ?? [],
  });
}

/** A file as checkpoint `to` kept it (`kept` false: it did not exist then). */
export async function readCheckpointFile(client: FwaiClient, sessionId: string, to: string, path: string) {
  const r = await client.call('Sessions', 'ReadCheckpointFile', { session_id: sessionId, to, path });
  return { checkpoint: r.checkpoint, kept: r.kept, text: Buffer.from(r.content).toString('utf8'), sha256: r.sha256 };
}
