// The daemon's session events as proto-loader gives them (snake_case fields,
// `payload` naming the set member). Pure types: no Node or vscode imports, so
// the webview shares them.

export interface Usage {
  input_tokens: number;
  output_tokens: number;
  cost_usd: number;
}
export interface AgentRef {
  agent: string;
  parent_call_id: string;
}
export interface QuestionOption {
  label: string;
  description: string;
}
export interface Question {
  id: string;
  text: string;
  options: QuestionOption[];
  multiple: boolean;
  allow_free_text: boolean;
}
export interface Todo {
  id: string;
  content: string;
  status: string;
  parent_id: string;
}

export interface ServerEvent {
  session_id: string;
  seq: number;
  time_us: number;
  turn_id: string;
  payload?: string;
  text_delta?: { origin?: AgentRef | null; text: string; thinking: boolean };
  message_done?: { origin?: AgentRef | null; role: string; stop_reason: string; usage?: Usage | null; model: string };
  tool_call_started?: {
    origin?: AgentRef | null;
    call_id: string;
    parent_call_id: string;
    agent: string;
    tool: string;
    input_json: string;
  };
  tool_call_output_delta?: { call_id: string; parent_call_id: string; agent: string; text: string };
  tool_call_finished?: {
    call_id: string;
    parent_call_id: string;
    agent: string;
    is_error: boolean;
    output: string;
    duration_ms: number;
  };
  question_asked?: { question_id: string; questions: Question[]; call_id: string };
  question_answered?: { question_id: string; selected: string[]; text: string; answered_by: string; call_id: string };
  plan_submitted?: { plan_id: string; text: string; path: string; call_id: string };
  plan_decided?: { plan_id: string; approved: boolean; edited: boolean; feedback: string; decided_by: string };
  mode_changed?: { mode: string; reason: string };
  todos_updated?: { todos: Todo[] };
  turn_started?: { provider: string; model: string };
  turn_finished?: { usage?: Usage | null; stop_reason: string; iterations: number; duration_ms: number };
  error?: { code: string; message: string; retryable: boolean };
  user_message?: { text: string; sender: string };
  compacted?: { dropped_messages: number; summary: string };
  tools_offered?: { origin?: AgentRef | null; tools: string[]; reason: string };
}

/** The name of the event's payload ("text_delta", ...), also for objects without `payload`. */
export function eventType(ev: ServerEvent): string {
  if (ev.payload) return ev.payload;
  for (const k of Object.keys(ev)) {
    if (!['session_id', 'seq', 'time_us', 'turn_id', 'payload'].includes(k) && (ev as any)[k] != null) return k;
  }
  return 'unknown';
}

export interface SessionInfo {
  id: string;
  title: string;
  owner: string;
  project_root: string;
  created_us: number;
  updated_us: number;
  provider: string;
  model: string;
  mode: string;
  last_seq: number;
  turn_running: boolean;
  todos: Todo[];
  auto_approve_plan: boolean;
  usage?: Usage | null;
}
