// The daemon's session events as proto-loader gives them (snake_case fields,
// `payload` naming the set member): the types generated from
// proto/fwai/v1/events.proto and sessions.proto (their `__Output` variants,
// what the daemon answers). Pure types: no Node or vscode imports, so the
// webview shares them.
import type { AgentRef__Output } from '../generated/fwai/v1/AgentRef';
import type { EditProposal__Output } from '../generated/fwai/v1/EditProposal';
import type { Question__Output } from '../generated/fwai/v1/Question';
import type { QuestionOption__Output } from '../generated/fwai/v1/QuestionOption';
import type { ServerEvent__Output } from '../generated/fwai/v1/ServerEvent';
import type { Session__Output } from '../generated/fwai/v1/Session';
import type { Todo__Output } from '../generated/fwai/v1/Todo';
import type { Usage__Output } from '../generated/fwai/v1/Usage';

export type Usage = Usage__Output;
export type AgentRef = AgentRef__Output;
export type QuestionOption = QuestionOption__Output;
export type Question = Question__Output;
export type Todo = Todo__Output;
/** A write_file / edit_file call waiting for the user's accept (the session asks before edits). */
export type EditProposal = EditProposal__Output;
export type ServerEvent = ServerEvent__Output;
/** A session as Sessions.Get, List and Create answer it. */
export type SessionInfo = Session__Output;

/** The name of the event's payload ("text_delta", ...), also for objects without `payload`. */
export function eventType(ev: ServerEvent): string {
  if (ev.payload) return ev.payload;
  for (const k of Object.keys(ev)) {
    if (!['session_id', 'seq', 'time_us', 'turn_id', 'payload'].includes(k) && (ev as any)[k] != null) return k;
  }
  return 'unknown';
}
