// A session as a tree: turns; in each, text and tool calls in the order they
// happened, a sub-agent's text and calls nested under the call that delegated
// to it (parent_call_id), to any depth. Pending question and plan, todos,
// mode and cost. Pure: shared by the extension host and the chat webview.
import { EditProposal, Question, ServerEvent, Todo, Usage, eventType } from './events';

export interface TextItem {
  kind: 'text';
  id: string;
  agent: string;
  text: string;
  thinking: boolean;
}
export interface NoticeItem {
  kind: 'notice';
  id: string;
  level: 'info' | 'error';
  text: string;
}
export interface ToolNode {
  kind: 'tool';
  id: string; // = callId
  callId: string;
  parentCallId: string;
  turnId: string;
  agent: string;
  tool: string;
  input: string;
  output: string;
  result: string;
  status: 'running' | 'ok' | 'error';
  durationMs: number;
  startedUs: number;
  children: Item[];
}
export type Item = TextItem | ToolNode | NoticeItem;

export interface Turn {
  id: string;
  userText: string;
  sender: string;
  /** Who sent the message, as fwaid verified it ("alice"); '' from an older daemon. */
  author: string;
  /** The author is the session's owner (false: a user it is shared with). */
  authorIsOwner: boolean;
  /** Who cancelled the turn ("bob"), when a user did. */
  cancelledBy: string;
  items: Item[];
  running: boolean;
  provider: string;
  model: string;
  usage: Usage | null;
  stopReason: string;
  durationMs: number;
  startedUs: number;
}

export interface PendingQuestion {
  questionId: string;
  callId: string;
  turnId: string;
  questions: Question[];
  /** Set when the question asks to accept an agent's edit. */
  edit: EditProposal | null;
}
export interface PendingPlan {
  planId: string;
  callId: string;
  turnId: string;
  text: string;
  path: string;
}

/** A question answered or a plan decided: by whom (with their client, and as people name them) and when. */
export interface Resolution {
  kind: 'question' | 'plan' | 'edit';
  edit?: string; // "edit_file src/main.c", for an edit's accept
  id: string;
  by: string; // "alice (uid 1000) via vscode 1.100.3 pid 4242": for the record
  user: string; // "alice"; '' from an older daemon or for auto_approve_plan
  timeUs: number;
  summary: string;
}

const ROLE_RANK: Record<string, number> = { watch: 0, answer: 1, approve: 2, drive: 3, owner: 4 };

/**
 * Whether the caller's standing in a session (`my_role`: "owner", or a
 * share's role; '' from an older daemon: the owner) reaches `need`. fwaid
 * checks every call anyway; clients only do not offer the rest.
 */
export function roleAllows(s: { my_role?: string } | null | undefined, need: keyof typeof ROLE_RANK | string): boolean {
  const mine = s?.my_role || 'owner';
  return (ROLE_RANK[mine] ?? 0) >= (ROLE_RANK[need] ?? ROLE_RANK.owner);
}

/** "Plan approved as edited by alice, 10:42" (local time). */
export function resolutionLine(r: Resolution): string {
  const what =
    r.kind === 'edit'
      ? `${r.edit} ${r.summary}`
      : `${r.kind === 'plan' ? 'Plan' : 'Question'} ${r.summary || 'answered'}`;
  const who = r.user || (r.by === 'auto_approve_plan' ? 'auto_approve_plan' : r.by.replace(/ \(.*$/, ''));
  if (!who) return what;
  const at = new Date(r.timeUs / 1000);
  const hhmm = `${String(at.getHours()).padStart(2, '0')}:${String(at.getMinutes()).padStart(2, '0')}`;
  return `${what} by ${who}${r.timeUs > 0 ? `, ${hhmm}` : ''}`;
}

/**
 * A call's result as the chat shows it: a sub-agent's answer is shown once,
 * as the sub-agent's own text under the call, so the delegating call's result
 * is not repeated when that text already says it.
 */
export function shownResult(n: ToolNode): string {
  if (n.tool !== 'delegateSubagent' || n.status !== 'ok') return n.result;
  const said = n.children
    .filter((c): c is TextItem => c.kind === 'text' && !c.thinking)
    .map((c) => c.text.trim())
    .join('\n');
  const result = n.result.trim();
  return result && said.includes(result) ? '' : n.result;
}

/** What changed, for renderers that update incrementally. */
export type Change =
  | { type: 'turn'; turnId: string; added: boolean }
  | { type: 'item'; turnId: string; parentCallId: string; item: Item }
  | { type: 'text'; itemId: string; appended: string }
  | { type: 'tool'; callId: string }
  | { type: 'toolOutput'; callId: string; appended: string }
  | { type: 'todos' }
  | { type: 'mode' }
  | { type: 'question' }
  | { type: 'plan' }
  | { type: 'usage' };

export class SessionModel {
  turns: Turn[] = [];
  readonly turnById = new Map<string, Turn>();
  readonly calls = new Map<string, ToolNode>();
  todos: Todo[] = [];
  mode = '';
  /** The agent's write_file / edit_file wait for the user's accept. */
  askBeforeEdits = false;
  question: PendingQuestion | null = null;
  plan: PendingPlan | null = null;
  /** The last resolved question/plan, with who answered (shown to the other clients). */
  lastResolution: Resolution | null = null;
  /**
   * Someone other than the owner has written or decided in this session: the
   * chat names every message's author from then on.
   */
  shared = false;
  lastSeq = 0;
  usage: Usage = { input_tokens: 0, output_tokens: 0, cost_usd: 0 };
  events = 0;
  private nextItem = 0;

  constructor(readonly sessionId = '') {}

  get running(): boolean {
    const t = this.turns[this.turns.length - 1];
    return !!t && t.running;
  }

  private turnFor(ev: ServerEvent, changes: Change[]): Turn | null {
    const id = ev.turn_id;
    if (!id) return null;
    let t = this.turnById.get(id);
    if (!t) {
      t = {
        id,
        userText: '',
        sender: '',
        author: '',
        authorIsOwner: true,
        cancelledBy: '',
        items: [],
        running: true,
        provider: '',
        model: '',
        usage: null,
        stopReason: '',
        durationMs: 0,
        startedUs: ev.time_us,
      };
      this.turns.push(t);
      this.turnById.set(id, t);
      changes.push({ type: 'turn', turnId: id, added: true });
    }
    return t;
  }

  /** The first author other than the owner: every turn shows its author from then on. */
  private noteAuthor(a: { owner: boolean } | null | undefined, changes: Change[]): void {
    if (!a || a.owner || this.shared) return;
    this.shared = true;
    for (const t of this.turns) changes.push({ type: 'turn', turnId: t.id, added: false });
  }

  /** A session-level notice, said under the event's turn or else the latest one (none yet: dropped). */
  private noticeOnLatest(turn: Turn | null, text: string, changes: Change[]): void {
    const last = turn ?? this.turns[this.turns.length - 1];
    if (!last) return;
    const item: NoticeItem = { kind: 'notice', id: `x${this.nextItem++}`, level: 'info', text };
    last.items.push(item);
    changes.push({ type: 'item', turnId: last.id, parentCallId: '', item });
  }

  /** The list a new item of `parentCallId` goes into (the turn's when the parent is unknown). */
  private container(turn: Turn, parentCallId: string): { list: Item[]; parent: string } {
    if (parentCallId) {
      const p = this.calls.get(parentCallId);
      if (p) return { list: p.children, parent: parentCallId };
    }
    return { list: turn.items, parent: '' };
  }

  /** Applies one event; events at or below the last seq seen are ignored (replays). */
  apply(ev: ServerEvent): Change[] {
    const changes: Change[] = [];
    if (ev.seq && ev.seq <= this.lastSeq) return changes;
    if (ev.seq) this.lastSeq = ev.seq;
    this.events++;
    const type = eventType(ev);
    const turn = this.turnFor(ev, changes);
    switch (type) {
      case 'user_message': {
        if (turn) {
          const m = ev.user_message!;
          turn.userText = m.text;
          turn.sender = m.sender;
          turn.author = m.author?.user ?? '';
          turn.authorIsOwner = m.author ? m.author.owner : true;
          this.noteAuthor(m.author, changes);
          changes.push({ type: 'turn', turnId: turn.id, added: false });
        }
        break;
      }
      case 'turn_started': {
        if (turn) {
          turn.provider = ev.turn_started!.provider;
          turn.model = ev.turn_started!.model;
          turn.running = true;
          changes.push({ type: 'turn', turnId: turn.id, added: false });
        }
        break;
      }
      case 'text_delta': {
        if (!turn) break;
        const d = ev.text_delta!;
        const agent = d.origin?.agent || 'main';
        const { list, parent } = this.container(turn, d.origin?.parent_call_id ?? '');
        const last = list[list.length - 1];
        if (last && last.kind === 'text' && last.agent === agent && last.thinking === !!d.thinking) {
          last.text += d.text;
          changes.push({ type: 'text', itemId: last.id, appended: d.text });
        } else {
          const item: TextItem = {
            kind: 'text',
            id: `x${this.nextItem++}`,
            agent,
            text: d.text,
            thinking: !!d.thinking,
          };
          list.push(item);
          changes.push({ type: 'item', turnId: turn.id, parentCallId: parent, item });
        }
        break;
      }
      case 'tool_call_started': {
        if (!turn) break;
        const s = ev.tool_call_started!;
        const parentCallId = s.parent_call_id || s.origin?.parent_call_id || '';
        const node: ToolNode = {
          kind: 'tool',
          id: s.call_id,
          callId: s.call_id,
          parentCallId,
          turnId: turn.id,
          agent: s.agent || s.origin?.agent || 'main',
          tool: s.tool,
          input: s.input_json,
          output: '',
          result: '',
          status: 'running',
          durationMs: 0,
          startedUs: ev.time_us,
          children: [],
        };
        const { list, parent } = this.container(turn, parentCallId);
        list.push(node);
        this.calls.set(s.call_id, node);
        changes.push({ type: 'item', turnId: turn.id, parentCallId: parent, item: node });
        break;
      }
      case 'tool_call_output_delta': {
        const d = ev.tool_call_output_delta!;
        const node = this.calls.get(d.call_id);
        if (node) {
          node.output += d.text;
          changes.push({ type: 'toolOutput', callId: d.call_id, appended: d.text });
        }
        break;
      }
      case 'tool_call_finished': {
        const f = ev.tool_call_finished!;
        const node = this.calls.get(f.call_id);
        if (node) {
          node.result = f.output;
          node.status = f.is_error ? 'error' : 'ok';
          node.durationMs = f.duration_ms;
          changes.push({ type: 'tool', callId: f.call_id });
        }
        if (this.question && this.question.callId === f.call_id) {
          this.question = null;
          changes.push({ type: 'question' });
        }
        if (this.plan && this.plan.callId === f.call_id) {
          this.plan = null;
          changes.push({ type: 'plan' });
        }
        break;
      }
      case 'question_asked': {
        const q = ev.question_asked!;
        this.question = {
          questionId: q.question_id,
          callId: q.call_id,
          turnId: ev.turn_id,
          questions: q.questions ?? [],
          edit: q.edit ?? null,
        };
        changes.push({ type: 'question' });
        break;
      }
      case 'question_answered': {
        const a = ev.question_answered!;
        const edit = this.question?.questionId === a.question_id ? this.question.edit : null;
        const summary = edit
          ? `${(a.selected ?? []).includes('Accept') ? 'accepted' : 'rejected'}${a.text ? `: ${a.text}` : ''}`
          : [...(a.selected ?? []), a.text].filter((x) => x).join('; ');
        this.lastResolution = {
          kind: edit ? 'edit' : 'question',
          ...(edit ? { edit: `${edit.tool} ${edit.path}` } : {}),
          id: a.question_id,
          by: a.answered_by,
          user: a.author?.user || a.answered_by_user || '',
          timeUs: ev.time_us,
          summary,
        };
        this.noteAuthor(a.author, changes);
        if (this.question && this.question.questionId === a.question_id) this.question = null;
        changes.push({ type: 'question' });
        break;
      }
      case 'plan_submitted': {
        const p = ev.plan_submitted!;
        this.plan = { planId: p.plan_id, callId: p.call_id, turnId: ev.turn_id, text: p.text, path: p.path };
        changes.push({ type: 'plan' });
        break;
      }
      case 'plan_decided': {
        const d = ev.plan_decided!;
        const summary = d.approved
          ? d.edited
            ? 'approved as edited'
            : 'approved'
          : `sent back${d.feedback ? `: ${d.feedback}` : ''}`;
        this.lastResolution = {
          kind: 'plan',
          id: d.plan_id,
          by: d.decided_by,
          user: d.author?.user || d.decided_by_user || '',
          timeUs: ev.time_us,
          summary,
        };
        this.noteAuthor(d.author, changes);
        if (this.plan && this.plan.planId === d.plan_id) this.plan = null;
        changes.push({ type: 'plan' });
        break;
      }
      case 'mode_changed': {
        const m = ev.mode_changed!;
        this.mode = m.mode;
        if (m.author && !m.author.owner) {
          this.noteAuthor(m.author, changes);
          this.noticeOnLatest(turn, `${m.author.user} switched to ${m.mode} mode`, changes);
        }
        changes.push({ type: 'mode' });
        break;
      }
      case 'edit_approval_changed': {
        this.askBeforeEdits = ev.edit_approval_changed!.ask_before_edits;
        changes.push({ type: 'mode' });
        break;
      }
      case 'todos_updated': {
        this.todos = ev.todos_updated!.todos ?? [];
        changes.push({ type: 'todos' });
        break;
      }
      case 'error': {
        if (!turn) break;
        const e = ev.error!;
        const item: NoticeItem = {
          kind: 'notice',
          id: `x${this.nextItem++}`,
          level: 'error',
          text: `${e.code}: ${e.message}`,
        };
        turn.items.push(item);
        changes.push({ type: 'item', turnId: turn.id, parentCallId: '', item });
        break;
      }
      case 'board_notice': {
        // A watch on a board the session holds fired: said under the latest turn.
        const n = ev.board_notice!;
        this.noticeOnLatest(turn, `[${n.board}] ${n.text}`, changes);
        break;
      }
      case 'rewound': {
        const r = ev.rewound!;
        const boards = r.boards.length ? `, boards ${r.boards.join(', ')}` : '';
        this.noticeOnLatest(
          turn,
          `rewound to checkpoint ${r.checkpoint} (before turn ${r.turn_id}) by ${r.by}: ${r.files} files${boards}`,
          changes,
        );
        break;
      }
      case 'compacted': {
        if (!turn) break;
        const item: NoticeItem = {
          kind: 'notice',
          id: `x${this.nextItem++}`,
          level: 'info',
          text: `compacted ${ev.compacted!.dropped_messages} older messages`,
        };
        turn.items.push(item);
        changes.push({ type: 'item', turnId: turn.id, parentCallId: '', item });
        break;
      }
      case 'turn_finished': {
        if (!turn) break;
        const f = ev.turn_finished!;
        turn.running = false;
        turn.usage = f.usage ?? null;
        turn.stopReason = f.stop_reason;
        turn.cancelledBy = f.cancelled_by?.user ?? '';
        turn.durationMs = f.duration_ms;
        if (f.usage) {
          this.usage = {
            input_tokens: this.usage.input_tokens + (f.usage.input_tokens || 0),
            output_tokens: this.usage.output_tokens + (f.usage.output_tokens || 0),
            cost_usd: this.usage.cost_usd + (f.usage.cost_usd || 0),
          };
          changes.push({ type: 'usage' });
        }
        // Calls left running (a cancelled turn) end with it.
        for (const node of this.calls.values()) {
          if (node.turnId === turn.id && node.status === 'running') {
            node.status = 'error';
            node.result ||= `(${f.stop_reason})`;
            changes.push({ type: 'tool', callId: node.callId });
          }
        }
        if (this.question && this.question.turnId === turn.id) {
          this.question = null;
          changes.push({ type: 'question' });
        }
        if (this.plan && this.plan.turnId === turn.id) {
          this.plan = null;
          changes.push({ type: 'plan' });
        }
        changes.push({ type: 'turn', turnId: turn.id, added: false });
        break;
      }
      default:
        break;
    }
    return changes;
  }

  /** Starts the cost from the session's stored totals (turns before the replayed window). */
  setBaseUsage(u: Usage | null | undefined): void {
    if (u)
      this.usage = {
        input_tokens: u.input_tokens || 0,
        output_tokens: u.output_tokens || 0,
        cost_usd: u.cost_usd || 0,
      };
  }

  /** An indented outline of a turn ("tool(agent) [status]" and text), for tests and logs. */
  outline(turnId?: string): string {
    const t = turnId ? this.turnById.get(turnId) : this.turns[this.turns.length - 1];
    if (!t) return '';
    const lines: string[] = [];
    const walk = (items: Item[], depth: number) => {
      for (const it of items) {
        const pad = '  '.repeat(depth);
        if (it.kind === 'text') lines.push(`${pad}text(${it.agent}): ${it.text}`);
        else if (it.kind === 'notice') lines.push(`${pad}${it.level}: ${it.text}`);
        else {
          lines.push(`${pad}${it.tool}(${it.agent}) [${it.status}]`);
          walk(it.children, depth + 1);
        }
      }
    };
    walk(t.items, 0);
    return lines.join('\n');
  }
}

/** "1.2 s", "850 ms", "2 min 3 s". */
export function formatDuration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  const m = Math.floor(ms / 60000);
  return `${m} min ${Math.round((ms % 60000) / 1000)} s`;
}

export function formatCost(usd: number): string {
  return usd >= 1 ? `$${usd.toFixed(2)}` : `$${usd.toFixed(4)}`;
}
