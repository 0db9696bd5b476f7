// The caller's sessions (Sessions.List, Get, Create, Delete): what the
// Sessions view lists and the chat opens. A session's live stream is
// SessionStream (session.ts).
import { FwaiClient } from './connection';
import { SessionInfo } from './events';

/** The caller's sessions (`all`: every owner's, for an admin), newest activity first. */
export async function listSessions(client: FwaiClient, o: { all?: boolean } = {}): Promise<SessionInfo[]> {
  const r = await client.call('Sessions', 'List', { all: !!o.all });
  return r.sessions.sort((a, b) => b.updated_us - a.updated_us);
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
}

export function createSession(client: FwaiClient, o: NewSession): Promise<SessionInfo> {
  return client.call('Sessions', 'Create', {
    title: o.title ?? '',
    project_root: o.projectRoot,
    provider: o.provider ?? '',
    model: o.model ?? '',
    mode: o.mode ?? 'act',
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
  });
}
