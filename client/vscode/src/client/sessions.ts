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
