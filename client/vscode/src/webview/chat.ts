// The chat view's page. It keeps its own SessionModel (the same code the
// extension host uses) fed with the session's events, and updates the DOM
// incrementally, once per animation frame: text deltas append to their block,
// tool calls are rows nested under the call that delegated to them.
import MarkdownIt from 'markdown-it';
import { EditProposal, Question, ServerEvent, SessionInfo } from '../client/events';
import {
  Change,
  Item,
  SessionModel,
  TextItem,
  ToolNode,
  formatCost,
  formatDuration,
  resolutionLine,
  roleAllows,
  shownResult,
} from '../client/model';

declare function acquireVsCodeApi(): { postMessage(msg: unknown): void; setState(s: unknown): void; getState(): any };
const vscode = acquireVsCodeApi();

type FromHost =
  | {
      type: 'reset';
      session: SessionInfo | null;
      connection: string;
      perf?: boolean;
      mode?: string;
      askBeforeEdits?: boolean;
    }
  | { type: 'mode'; mode: string; askBeforeEdits?: boolean }
  | { type: 'events'; events: ServerEvent[]; perf?: [number, number][][]; postMs?: number }
  | { type: 'connection'; state: string; detail?: string }
  | { type: 'perf'; enable: boolean }
  | { type: 'perfReport' }
  | { type: 'focusInput' };

const md = new MarkdownIt({ html: false, linkify: true, breaks: false });

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const el = <K extends keyof HTMLElementTagNameMap>(tag: K, cls?: string, text?: string) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};

let model = new SessionModel('');
let session: SessionInfo | null = null;
const turnEls = new Map<string, { root: HTMLElement; items: HTMLElement; footer: HTMLElement; head: HTMLElement }>();
const itemEls = new Map<string, HTMLElement>(); // text item id / call id -> element
const dirtyText = new Set<string>();
const dirtyTools = new Set<string>();
const dirtyTurns = new Set<string>();
let dirtyTodos = false;
let dirtyMode = false;
let dirtyQuestion = false;
let dirtyPlan = false;
let dirtyUsage = false;
let frameQueued = false;
// At most one redraw every MIN_FRAME_MS while a turn streams: each frame costs
// the workbench (which draws this page with it) a fixed amount whatever
// changed, so a burst drains faster in fewer, larger frames.
const MIN_FRAME_MS = 40;
let lastFlushAt = -MIN_FRAME_MS;
// Latency samples (perf mode): daemon time of each text delta, drawn at the next frame.
let perf = false;
let pendingDeltaTimes: number[] = [];
let pendingRecvMs: number[] = [];
const latencies: number[] = [];
// The same, split: daemon -> extension host, and extension host -> drawn.
const toHost: number[] = [];
const hostToDrawn: number[] = [];
// Of the latter: the extension host -> this page's message handler, and the work of a frame.
const hostToPage: number[] = [];
const postToPage: number[] = []; // the extension host posting a batch → this page taking it
const flushMs: number[] = [];
const keyLatencies: number[] = [];
let keyDownAt = 0;
let eventsRendered = 0;

// ---------------------------------------------------------------- rendering

function renderMarkdown(target: HTMLElement, text: string): void {
  target.innerHTML = md.render(text);
  for (const pre of Array.from(target.querySelectorAll('pre'))) {
    const code = pre.textContent ?? '';
    const bar = el('div', 'code-actions');
    const copy = el('button', 'code-btn', 'Copy');
    copy.title = 'Copy to the clipboard';
    copy.onclick = () => vscode.postMessage({ type: 'copy', text: code });
    const insert = el('button', 'code-btn', 'Insert');
    insert.title = 'Insert at the cursor of the active editor';
    insert.onclick = () => vscode.postMessage({ type: 'insert', text: code });
    bar.append(copy, insert);
    pre.before(bar);
  }
  linkRefs(target);
}

const REF_RE =
  /((?:\.{0,2}\/)?[\w.+@-]+(?:\/[\w.+@-]+)*\.(?:c|h|cc|cpp|hpp|s|S|ld|py|rs|md|ya?ml|json|txt|ino|dts|overlay)):(\d+)(?::(\d+))?/g;

/** Turns `file:line` in text nodes into links that open the file there. */
function linkRefs(root: HTMLElement): void {
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const nodes: Text[] = [];
  while (walker.nextNode()) nodes.push(walker.currentNode as Text);
  for (const n of nodes) {
    const s = n.data;
    REF_RE.lastIndex = 0;
    if (!REF_RE.test(s)) continue;
    REF_RE.lastIndex = 0;
    const frag = document.createDocumentFragment();
    let last = 0;
    for (const m of s.matchAll(REF_RE)) {
      const i = m.index ?? 0;
      frag.append(s.slice(last, i));
      const a = el('a', 'ref', m[0]);
      a.href = '#';
      a.onclick = (e) => {
        e.preventDefault();
        vscode.postMessage({ type: 'openRef', path: m[1], line: Number(m[2]), column: Number(m[3] ?? 1) });
      };
      frag.append(a);
      last = i + m[0].length;
    }
    frag.append(s.slice(last));
    n.replaceWith(frag);
  }
}

function prettyJson(s: string): string {
  try {
    return JSON.stringify(JSON.parse(s), null, 2);
  } catch {
    return s;
  }
}

function toolSummary(n: ToolNode): string {
  let input: any = {};
  try {
    input = JSON.parse(n.input || '{}');
  } catch {
    /* shown raw below */
  }
  if (n.tool === 'delegateSubagent') return `${input.agent_type ?? ''}: ${String(input.task ?? '').slice(0, 80)}`;
  const v = input.path ?? input.command ?? input.pattern ?? input.query ?? input.file ?? '';
  return String(v).split('\n')[0].slice(0, 80);
}

function newTextEl(item: TextItem): HTMLElement {
  const e = el('div', `text agent-${item.agent === 'main' ? 'main' : 'sub'}${item.thinking ? ' thinking' : ''}`);
  e.dataset.id = item.id;
  if (item.agent !== 'main') e.append(el('div', 'agent-label', item.agent));
  e.append(el('div', 'md'));
  return e;
}

// A tool call's row is its summary line; its body (input, output, result,
// actions) is made when it is first opened. A turn with hundreds of calls
// costs the page a line each, not a dozen elements and a pretty-printed input.
function newToolEl(n: ToolNode): HTMLElement {
  const d = el('details', `tool status-${n.status}`) as HTMLDetailsElement;
  d.dataset.callId = n.callId;
  d.dataset.tool = n.tool;
  d.dataset.agent = n.agent;
  const s = el('summary');
  s.append(
    el('span', 'status-icon'),
    el('span', 'tool-name', n.tool),
    el('span', 'agent', n.agent === 'main' ? '' : n.agent),
  );
  s.append(el('span', 'tool-arg', toolSummary(n)), el('span', 'duration'));
  // Before the row opens (a click or a key on its summary), or as it opens.
  s.addEventListener('click', () => ensureToolBody(d));
  d.addEventListener('toggle', () => d.open && ensureToolBody(d));
  d.append(s, el('div', 'children'));
  if (n.tool === 'delegateSubagent') {
    d.open = true;
    ensureToolBody(d);
  }
  return d;
}

function ensureToolBody(d: HTMLElement): void {
  if (d.querySelector(':scope > .tool-body')) return;
  const n = model.calls.get(d.dataset.callId ?? '');
  if (!n) return;
  const body = el('div', 'tool-body');
  const actions = el('div', 'tool-actions');
  body.append(
    el('pre', 'tool-input', prettyJson(n.input)),
    el('pre', 'tool-output'),
    el('pre', 'tool-result'),
    actions,
  );
  if (n.tool === 'write_file' || n.tool === 'edit_file') {
    const b = el('button', 'code-btn diff-btn', 'Show diff');
    b.onclick = () => vscode.postMessage({ type: 'showDiff', callId: n.callId });
    actions.append(b);
  }
  d.insertBefore(body, d.querySelector(':scope > .children'));
  fillToolBody(d, n);
}

function updateToolEl(n: ToolNode): void {
  const d = itemEls.get(n.callId);
  if (!d) return;
  d.className = `tool status-${n.status}`;
  (d.querySelector('.duration') as HTMLElement).textContent =
    n.status === 'running' ? '' : formatDuration(n.durationMs);
  fillToolBody(d, n);
}

function fillToolBody(d: HTMLElement, n: ToolNode): void {
  const body = d.querySelector(':scope > .tool-body');
  if (!body) return;
  const out = body.querySelector('.tool-output') as HTMLElement;
  out.textContent = n.output;
  out.style.display = n.output ? '' : 'none';
  const res = body.querySelector('.tool-result') as HTMLElement;
  const result = shownResult(n);
  res.textContent = result;
  res.style.display = result ? '' : 'none';
  if (result) linkRefs(res);
}

function containerEl(turnId: string, parentCallId: string): HTMLElement | null {
  if (parentCallId) {
    const p = itemEls.get(parentCallId);
    if (p) return p.querySelector(':scope > .children') as HTMLElement;
  }
  return turnEls.get(turnId)?.items ?? null;
}

function ensureTurnEl(turnId: string): void {
  if (turnEls.has(turnId)) return;
  const root = el('div', 'turn');
  root.dataset.turnId = turnId;
  const head = el('div', 'user');
  const items = el('div', 'items');
  const footer = el('div', 'turn-footer');
  const review = el('button', 'code-btn review-btn', 'Review changes') as HTMLButtonElement;
  review.title = 'Every file that differs from before this turn, as diffs: keep or revert each file or hunk';
  review.onclick = () => vscode.postMessage({ type: 'reviewTurn', turnId });
  root.append(head, items, footer, review);
  $('messages').append(root);
  turnEls.set(turnId, { root, items, footer, head });
}

function updateTurnEl(turnId: string): void {
  const t = model.turnById.get(turnId);
  const e = turnEls.get(turnId);
  if (!t || !e) return;
  // In a shared session each message says whose it is ("bob: …").
  if (model.shared && t.author) {
    const who = el('span', 'author', `${t.author}: `);
    who.classList.toggle('guest', !t.authorIsOwner);
    e.head.replaceChildren(who, document.createTextNode(t.userText));
  } else {
    e.head.textContent = t.userText;
  }
  e.head.title = t.sender ? `from ${t.sender}` : '';
  e.root.classList.toggle('running', t.running);
  (e.root.querySelector(':scope > .review-btn') as HTMLElement).style.display = t.running ? 'none' : '';
  if (t.running) {
    e.footer.textContent = t.model ? `${t.model} · working…` : 'working…';
  } else {
    const u = t.usage;
    const parts = [
      t.stopReason && t.stopReason !== 'end_turn'
        ? `${t.stopReason}${t.cancelledBy ? ` by ${t.cancelledBy}` : ''}`
        : '',
      u ? `${u.input_tokens.toLocaleString()} in · ${u.output_tokens.toLocaleString()} out` : '',
      u ? formatCost(u.cost_usd) : '',
      formatDuration(t.durationMs),
    ];
    e.footer.textContent = parts.filter((x) => x).join(' · ');
    e.footer.classList.toggle('stopped', !!t.stopReason && t.stopReason !== 'end_turn');
  }
}

function onChanges(changes: Change[]): void {
  for (const c of changes) {
    switch (c.type) {
      case 'turn':
        ensureTurnEl(c.turnId);
        dirtyTurns.add(c.turnId);
        break;
      case 'item': {
        ensureTurnEl(c.turnId);
        const parent = containerEl(c.turnId, c.parentCallId);
        if (!parent) break;
        if (c.item.kind === 'text') {
          const e = newTextEl(c.item);
          itemEls.set(c.item.id, e);
          parent.append(e);
          dirtyText.add(c.item.id);
        } else if (c.item.kind === 'tool') {
          const e = newToolEl(c.item);
          itemEls.set(c.item.callId, e);
          parent.append(e);
          dirtyTools.add(c.item.callId);
        } else {
          parent.append(el('div', `notice ${c.item.level}`, c.item.text));
        }
        break;
      }
      case 'text':
        dirtyText.add(c.itemId);
        break;
      case 'tool':
      case 'toolOutput':
        dirtyTools.add(c.callId);
        break;
      case 'todos':
        dirtyTodos = true;
        break;
      case 'mode':
        dirtyMode = true;
        break;
      case 'question':
        dirtyQuestion = true;
        break;
      case 'plan':
        dirtyPlan = true;
        break;
      case 'usage':
        dirtyUsage = true;
        break;
    }
  }
}

const textById = new Map<string, TextItem>();
function findText(id: string): TextItem | undefined {
  const hit = textById.get(id);
  if (hit) return hit;
  const walk = (items: Item[]): TextItem | undefined => {
    for (const i of items) {
      if (i.kind === 'text' && i.id === id) return i;
      if (i.kind === 'tool') {
        const r = walk(i.children);
        if (r) return r;
      }
    }
    return undefined;
  };
  for (let k = model.turns.length - 1; k >= 0; k--) {
    const r = walk(model.turns[k].items);
    if (r) {
      textById.set(id, r);
      return r;
    }
  }
  return undefined;
}

function flush(): void {
  const flushStart = perf ? performance.now() : 0;
  frameQueued = false;
  lastFlushAt = performance.now();
  const stick = isAtBottom();
  for (const id of dirtyText) {
    const item = findText(id);
    const e = itemEls.get(id);
    if (item && e) renderMarkdown(e.querySelector('.md') as HTMLElement, item.text);
  }
  dirtyText.clear();
  for (const id of dirtyTools) {
    const n = model.calls.get(id);
    if (n) updateToolEl(n);
  }
  dirtyTools.clear();
  for (const id of dirtyTurns) updateTurnEl(id);
  dirtyTurns.clear();
  if (dirtyTodos) renderTodos();
  if (dirtyMode || dirtyUsage) renderHeader();
  if (dirtyQuestion) renderQuestion();
  if (dirtyPlan) renderPlan();
  dirtyTodos = dirtyMode = dirtyUsage = dirtyQuestion = dirtyPlan = false;
  renderRunning();
  if (stick) scrollToBottom();
  if (perf && pendingDeltaTimes.length) {
    const times = pendingDeltaTimes;
    const recv = pendingRecvMs;
    pendingDeltaTimes = [];
    pendingRecvMs = [];
    // Measured at the frame that draws them.
    // Wall clock, as the daemon's time_us (performance.timeOrigin can be skewed from it).
    requestAnimationFrame(() => {
      const nowMs = Date.now();
      for (let i = 0; i < times.length; i++) {
        latencies.push(nowMs - times[i] / 1000);
        if (recv[i]) {
          toHost.push(recv[i] - times[i] / 1000);
          hostToDrawn.push(nowMs - recv[i]);
        }
      }
    });
  }
  document.body.dataset.events = String(eventsRendered);
  document.body.dataset.lastSeq = String(model.lastSeq);
  if (perf) flushMs.push(performance.now() - flushStart);
}

function schedule(): void {
  if (frameQueued) return;
  frameQueued = true;
  const wait = lastFlushAt + MIN_FRAME_MS - performance.now();
  if (wait <= 0) requestAnimationFrame(flush);
  else setTimeout(() => requestAnimationFrame(flush), wait);
}

function isAtBottom(): boolean {
  const m = $('messages');
  return m.scrollHeight - m.scrollTop - m.clientHeight < 40;
}
function scrollToBottom(): void {
  const m = $('messages');
  m.scrollTop = m.scrollHeight;
}

function renderHeader(): void {
  const mode = model.mode || session?.mode || 'act';
  $('mode-act').classList.toggle('active', mode === 'act');
  $('mode-plan').classList.toggle('active', mode === 'plan');
  $('ask-edits').classList.toggle('active', model.askBeforeEdits);
  $('ask-edits').setAttribute('aria-pressed', String(model.askBeforeEdits));
  const whose = session?.my_role && session.my_role !== 'owner' ? `${session.owner_user}'s · ` : '';
  $('title').textContent = session ? `${whose}${session.title || session.id}` : 'No session';
  $('title').title = session
    ? `${session.id} · ${session.project_root}${whose ? ` · shared with you to ${session.my_role}` : ''}`
    : '';
  $('cost').textContent = session ? formatCost(model.usage.cost_usd) : '';
  $('cost').title =
    `${model.usage.input_tokens.toLocaleString()} input · ${model.usage.output_tokens.toLocaleString()} output tokens`;
}

function renderRunning(): void {
  const running = model.running;
  $('cancel').style.display = running ? '' : 'none';
  document.body.classList.toggle('turn-running', running);
}

function renderTodos(): void {
  const box = $('todos');
  box.replaceChildren();
  if (!model.todos.length) {
    box.style.display = 'none';
    return;
  }
  box.style.display = '';
  const done = model.todos.filter((t) => t.status === 'completed').length;
  box.append(el('div', 'todos-head', `Todos ${done}/${model.todos.length}`));
  for (const t of model.todos) {
    const row = el('label', `todo todo-${t.status}${t.parent_id ? ' todo-child' : ''}`);
    const cb = el('input') as HTMLInputElement;
    cb.type = 'checkbox';
    cb.checked = t.status === 'completed';
    cb.disabled = true;
    row.append(cb, el('span', '', t.content));
    if (t.status === 'in_progress') row.append(el('span', 'todo-state', 'in progress'));
    box.append(row);
  }
}

function renderQuestion(): void {
  const box = $('question');
  box.replaceChildren();
  const q = model.question;
  if (!q) {
    box.style.display = 'none';
    showResolution('question');
    return;
  }
  box.style.display = '';
  box.dataset.questionId = q.questionId;
  if (q.edit) {
    renderEditQuestion(box, q.questionId, q.edit);
    return;
  }
  const form = el('form', 'question-form');
  const inputs: { q: Question; boxes: HTMLInputElement[]; free: HTMLInputElement | null }[] = [];
  for (const one of q.questions) {
    const fs = el('fieldset');
    fs.append(el('legend', '', one.text));
    const boxes: HTMLInputElement[] = [];
    for (const o of one.options) {
      const lab = el('label', 'option');
      const inp = el('input') as HTMLInputElement;
      inp.type = one.multiple ? 'checkbox' : 'radio';
      inp.name = one.id;
      inp.value = o.label;
      boxes.push(inp);
      lab.append(inp, el('span', '', o.label));
      if (o.description) lab.append(el('span', 'option-desc', o.description));
      fs.append(lab);
    }
    let free: HTMLInputElement | null = null;
    if (one.allow_free_text || !one.options.length) {
      free = el('input', 'free') as HTMLInputElement;
      free.type = 'text';
      free.placeholder = one.options.length ? 'or type an answer' : 'your answer';
      fs.append(free);
    }
    inputs.push({ q: one, boxes, free });
    form.append(fs);
  }
  const submit = el('button', 'primary', 'Answer') as HTMLButtonElement;
  submit.type = 'submit';
  form.append(submit);
  form.onsubmit = (e) => {
    e.preventDefault();
    const selected: string[] = [];
    const texts: string[] = [];
    for (const i of inputs) {
      for (const b of i.boxes) if (b.checked) selected.push(b.value);
      const v = i.free?.value.trim();
      if (v) texts.push(inputs.length > 1 ? `${i.q.text}: ${v}` : v);
    }
    vscode.postMessage({ type: 'answer', questionId: q.questionId, selected, text: texts.join('\n') });
    submit.disabled = true;
    submit.textContent = 'Sent';
  };
  box.append(el('div', 'card-head', 'The agent asks'), form);
  limitToRole(box, 'answer', 'answer');
  scrollToBottom();
}

/** An edit waiting for the user's accept: its preview, Accept / Reject (with why) and the whole diff. */
function renderEditQuestion(box: HTMLElement, questionId: string, edit: EditProposal): void {
  const preview = el('pre', 'edit-preview');
  for (const line of edit.preview.split('\n')) {
    if (!line) continue;
    const cls = line.startsWith('+') ? 'add' : line.startsWith('-') ? 'del' : 'hunk';
    preview.append(el('span', cls, `${line}\n`));
  }
  const why = el('input', 'free') as HTMLInputElement;
  why.type = 'text';
  why.placeholder = 'why not (for the agent; optional)';
  const answer = (selected: string) => {
    vscode.postMessage({ type: 'answer', questionId, selected: [selected], text: why.value.trim() });
    for (const b of Array.from(box.querySelectorAll('button'))) (b as HTMLButtonElement).disabled = true;
  };
  const accept = el('button', 'primary', 'Accept') as HTMLButtonElement;
  accept.dataset.action = 'accept';
  accept.onclick = () => answer('Accept');
  const reject = el('button', '', 'Reject') as HTMLButtonElement;
  reject.dataset.action = 'reject';
  reject.onclick = () => answer('Reject');
  const diff = el('button', '', 'Show diff') as HTMLButtonElement;
  diff.dataset.action = 'diff';
  diff.onclick = () => vscode.postMessage({ type: 'showProposedDiff', callId: edit.call_id });
  const actions = el('div', 'plan-actions');
  actions.append(accept, reject, diff);
  box.append(el('div', 'card-head', `${edit.tool} ${edit.path} waits for your accept`), preview, why, actions);
  limitToRole(box, 'approve', 'accept or reject it', ['diff']);
  scrollToBottom();
}

// What the caller may do in a session another user shares with them; fwaid
// checks every message anyway, the view only does not offer the rest.
function myRole(): string {
  return session?.my_role || 'owner';
}
function mayAct(need: string): boolean {
  return roleAllows(session, need);
}

/** Disables a card's controls (but those whose action is in `keep`) when the role does not reach `need`. */
function limitToRole(box: HTMLElement, need: string, what: string, keep: string[] = []): void {
  if (mayAct(need)) return;
  for (const c of Array.from(box.querySelectorAll('button, input'))) {
    const b = c as HTMLButtonElement | HTMLInputElement;
    if (!keep.includes(b.dataset.action ?? '')) b.disabled = true;
  }
  box.append(
    el(
      'div',
      'role-note',
      `You ${myRole()} ${session!.owner_user}'s session: the owner or a user who may ${what} will.`,
    ),
  );
}

/** The composer and the session's controls, as far as the caller's role goes. */
function applyRole(): void {
  const drive = mayAct('drive');
  document.body.dataset.role = myRole();
  const input = $('input') as HTMLTextAreaElement;
  input.disabled = !drive;
  if (!input.dataset.placeholder) input.dataset.placeholder = input.placeholder;
  input.placeholder = drive
    ? input.dataset.placeholder
    : `${session!.owner_user}'s session, shared with you to ${myRole()}: only its owner or a driver sends messages`;
  for (const id of ['send', 'cancel', 'mode-act', 'mode-plan', 'compact', 'ask-edits']) {
    ($(id) as HTMLButtonElement).disabled = !drive;
  }
}

function renderPlan(): void {
  const box = $('plan');
  box.replaceChildren();
  const p = model.plan;
  if (!p) {
    box.style.display = 'none';
    showResolution('plan');
    return;
  }
  box.style.display = '';
  box.dataset.planId = p.planId;
  const preview = el('div', 'plan-preview');
  renderMarkdown(preview, p.text);
  const actions = el('div', 'plan-actions');
  const mk = (label: string, action: string, cls = '') => {
    const b = el('button', cls, label);
    b.dataset.action = action;
    b.onclick = () => vscode.postMessage({ type: 'planAction', action, planId: p.planId });
    return b;
  };
  actions.append(mk('Approve', 'approve', 'primary'), mk('Edit', 'open'), mk('Redirect…', 'redirect'));
  box.append(el('div', 'card-head', `Plan to approve · ${p.path}`), preview, actions);
  limitToRole(box, 'approve', 'approve or redirect it', ['open']);
  scrollToBottom();
}

function showResolution(kind: 'question' | 'plan'): void {
  const r = model.lastResolution;
  const box = $('resolution');
  if (!r || (r.kind === 'plan') !== (kind === 'plan')) return;
  box.textContent = resolutionLine(r);
  box.title = r.by;
  box.style.display = '';
}

function reset(s: SessionInfo | null, mode = '', askBeforeEdits = false): void {
  session = s;
  // Usage adds up from the replayed turns (the stream starts at the first event).
  model = new SessionModel(s?.id ?? '');
  model.mode = s?.mode || mode;
  model.askBeforeEdits = s ? s.ask_before_edits : askBeforeEdits;
  if (s?.todos) model.todos = s.todos;
  turnEls.clear();
  itemEls.clear();
  textById.clear();
  $('messages').replaceChildren();
  $('resolution').style.display = 'none';
  $('empty').style.display = s ? 'none' : '';
  applyRole();
  eventsRendered = 0;
  dirtyTodos = dirtyMode = dirtyUsage = dirtyQuestion = dirtyPlan = true;
  schedule();
}

// ---------------------------------------------------------------- messages

window.addEventListener('message', (e: MessageEvent<FromHost>) => {
  const m = e.data;
  switch (m.type) {
    case 'reset':
      if (m.perf !== undefined) perf = m.perf;
      reset(m.session, m.mode, m.askBeforeEdits);
      setConnection(m.connection);
      break;
    case 'mode':
      // The mode the next session starts in (no session is open yet).
      model.mode = m.mode;
      if (m.askBeforeEdits !== undefined) model.askBeforeEdits = m.askBeforeEdits;
      dirtyMode = true;
      schedule();
      break;
    case 'events':
      if (perf && m.postMs) postToPage.push(Date.now() - m.postMs);
      for (let i = 0; i < m.events.length; i++) {
        const ev = m.events[i];
        const changes = model.apply(ev);
        if (!changes.length) continue;
        eventsRendered++;
        if (perf && ev.payload === 'text_delta') {
          // Each delta the extension host sent as this one: [daemon time_us, host ms].
          for (const [us, recv] of m.perf?.[i] ?? [[ev.time_us, 0]]) {
            pendingDeltaTimes.push(us);
            pendingRecvMs.push(recv);
            if (recv) hostToPage.push(Date.now() - recv);
          }
        }
        onChanges(changes);
      }
      schedule();
      break;
    case 'connection':
      setConnection(m.state, m.detail);
      break;
    case 'perf':
      perf = m.enable;
      latencies.length = 0;
      break;
    case 'perfReport':
      vscode.postMessage({
        type: 'perfReport',
        latencies: latencies.slice(),
        events: eventsRendered,
      });
      break;
    case 'focusInput':
      $('input').focus();
      break;
  }
});

function setConnection(state: string, detail = ''): void {
  const c = $('connection');
  c.textContent =
    state === 'open'
      ? ''
      : state === 'reconnecting'
        ? `reconnecting to fwaid… ${detail}`
        : state === 'waiting'
          ? `not connected: ${detail}. This session reopens by itself once that is fixed.`
          : state === 'closed' && detail
            ? detail
            : '';
  c.style.display = c.textContent ? '' : 'none';
  document.body.dataset.connection = state;
}

function send(): void {
  const input = $('input') as HTMLTextAreaElement;
  const text = input.value.trim();
  if (!text) return;
  if (text === '/compact') vscode.postMessage({ type: 'compact' });
  else if (text === '/plan' || text === '/act') vscode.postMessage({ type: 'setMode', mode: text.slice(1) });
  else vscode.postMessage({ type: 'send', text });
  input.value = '';
}

$('send').onclick = send;
$('input').addEventListener('keydown', (e: KeyboardEvent) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  }
});
$('cancel').onclick = () => vscode.postMessage({ type: 'cancel' });
$('mode-act').onclick = () => vscode.postMessage({ type: 'setMode', mode: 'act' });
$('mode-plan').onclick = () => vscode.postMessage({ type: 'setMode', mode: 'plan' });
$('compact').onclick = () => vscode.postMessage({ type: 'compact' });
$('ask-edits').onclick = () => vscode.postMessage({ type: 'setEditApproval', on: !model.askBeforeEdits });
$('new-session').onclick = () => vscode.postMessage({ type: 'newSession' });

// Keystroke to the frame that shows it, while the view streams.
document.addEventListener(
  'keydown',
  () => {
    if (perf) keyDownAt = performance.now();
  },
  true,
);
document.addEventListener(
  'input',
  () => {
    if (!perf || !keyDownAt) return;
    const t = keyDownAt;
    keyDownAt = 0;
    requestAnimationFrame(() => keyLatencies.push(performance.now() - t));
  },
  true,
);

// For the measurements (fwai.measure): read by the e2e suite from this frame.
(window as any).__fwaiPerf = {
  latencies,
  toHost,
  hostToDrawn,
  hostToPage,
  postToPage,
  flushMs,
  keyLatencies,
  events: () => eventsRendered,
  reset: () => {
    latencies.length = 0;
    keyLatencies.length = 0;
    toHost.length = 0;
    hostToDrawn.length = 0;
    hostToPage.length = 0;
    postToPage.length = 0;
    flushMs.length = 0;
    keyDownAt = 0;
  },
};

vscode.postMessage({ type: 'ready' });
