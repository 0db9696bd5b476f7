// The chat: the current session's stream and model in the extension host, and
// the webview that draws it — an editor beside the code, with the editor
// area's full height (where agent chats live in VS Code), restored after a
// reload. Plans open in an editor; edits open as diffs; file:line references
// open the file there, in the code's column rather than over the chat.
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as vscode from 'vscode';
import {
  EventOutbox,
  FwaiError,
  ServerEvent,
  SessionInfo,
  SessionModel,
  SessionStream,
  StreamState,
  createSession,
  getSession,
  toFwaiError,
} from '../client';
import { Connection, shown } from './connection';
import { Edits } from './edits';

export class Chat implements vscode.WebviewPanelSerializer, vscode.Disposable {
  session: SessionInfo | null = null;
  model = new SessionModel('');
  stream: SessionStream | null = null;
  streamState: StreamState = 'closed';
  private readonly log: ServerEvent[] = [];
  private view: vscode.WebviewPanel | null = null;
  private ready = false;
  private outbox = new EventOutbox();
  private flushTimer: NodeJS.Timeout | null = null;
  private inFlight = new Set<number>(); // batches posted and not yet taken by the webview
  private pendingRoot: string | null = null;
  /** Latency and frame measurements in the webview (the hidden setting fwai.measure). */
  perf = vscode.workspace.getConfiguration('fwai').get<boolean>('measure', false);
  private perfWaiters: ((r: any) => void)[] = [];
  private readonly changed = new vscode.EventEmitter<void>();
  /** Session, mode, usage, plan or question changed. */
  readonly onDidChange = this.changed.event;
  private readonly eventEmitter = new vscode.EventEmitter<ServerEvent>();
  readonly onEvent = this.eventEmitter.event;
  private disposables: vscode.Disposable[] = [];

  constructor(
    private readonly ctx: vscode.ExtensionContext,
    private readonly conn: Connection,
    private readonly edits: Edits,
    private readonly out: vscode.OutputChannel,
  ) {
    this.disposables.push(
      // New settings or token: the stream on the old connection ends now and
      // the session reopens on the new one (again each time the connection
      // comes back, until it opens).
      conn.onDidReset(() => {
        if (!this.session) return;
        this.stream?.close();
        this.stream = null;
        this.reopenId = this.session.id;
        void this.reopen();
      }),
      conn.onDidChange(() => {
        if (this.reopenId && conn.state === 'connected') void this.reopen();
      }),
    );
  }

  /** The session to open again once the connection allows it, and why it could not be yet. */
  private reopenId: string | null = null;
  private reopenError = '';

  private async reopen(): Promise<void> {
    const id = this.reopenId;
    if (!id) return;
    try {
      await this.open(id, () => this.reopenId === id);
      if (this.reopenId === id) this.reopenId = null;
      this.reopenError = '';
    } catch (e) {
      if (this.reopenId !== id) return; // another session was opened meanwhile
      this.reopenError = shown(e);
      this.streamState = 'closed';
      this.post({ type: 'connection', state: 'waiting', detail: this.reopenError });
      this.changed.fire();
    }
  }

  // ---------------------------------------------------------------- webview

  /** Shows the chat: the open one revealed, or a new one beside the active editor. */
  show(preserveFocus = false): void {
    if (this.view) {
      this.view.reveal(this.view.viewColumn, preserveFocus);
      return;
    }
    const panel = vscode.window.createWebviewPanel(
      'fwai.chat',
      'fwai Chat',
      { viewColumn: vscode.ViewColumn.Beside, preserveFocus },
      { retainContextWhenHidden: true },
    );
    this.adopt(panel);
  }

  /** The chat a reload left open (VS Code asks for it by its view type). */
  async deserializeWebviewPanel(panel: vscode.WebviewPanel): Promise<void> {
    this.adopt(panel);
  }

  /** The editor column for code, files and diffs: not the chat's own. */
  codeColumn(): vscode.ViewColumn {
    const at = this.view?.viewColumn;
    const active = vscode.window.activeTextEditor?.viewColumn;
    if (active && active !== at) return active;
    return at === vscode.ViewColumn.One ? vscode.ViewColumn.Two : vscode.ViewColumn.One;
  }

  private adopt(panel: vscode.WebviewPanel): void {
    this.view?.dispose();
    this.view = panel;
    this.ready = false;
    this.inFlight = new Set();
    const view = panel;
    view.iconPath = vscode.Uri.joinPath(this.ctx.extensionUri, 'media', 'fwai.svg');
    const root = vscode.Uri.joinPath(this.ctx.extensionUri, 'dist', 'webview');
    view.webview.options = { enableScripts: true, localResourceRoots: [root] };
    const nonce = Math.random().toString(36).slice(2) + Math.random().toString(36).slice(2);
    const css = view.webview.asWebviewUri(vscode.Uri.joinPath(root, 'chat.css'));
    const js = view.webview.asWebviewUri(vscode.Uri.joinPath(root, 'chat.js'));
    view.webview.html = `<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src ${view.webview.cspSource}; script-src 'nonce-${nonce}'; img-src ${view.webview.cspSource} data:;">
<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="stylesheet" href="${css}"></head>
<body data-connection="closed">
<div id="header"><span id="title">No session</span><span id="cost"></span>
<span class="modes"><button id="mode-act" title="Act: all tools">Act</button><button id="mode-plan" title="Plan: read-only tools and a plan to approve">Plan</button></span>
<button id="ask-edits" title="Ask before edits: each write_file / edit_file of the agent waits for your Accept">Ask before edits</button>
<button id="compact" title="Summarise older turns now (/compact)">Compact</button></div>
<div id="connection" style="display:none"></div>
<div id="todos" style="display:none"></div>
<div id="messages"></div>
<div id="empty">No session open. Type below to start one in this workspace, or open one from <b>Sessions</b>. <button id="new-session">New session</button></div>
<div id="resolution" style="display:none"></div>
<div id="question" style="display:none"></div>
<div id="plan" style="display:none"></div>
<div id="composer"><textarea id="input" rows="2" placeholder="Ask fwai… (Enter sends, Shift+Enter: new line; /plan /act /compact)"></textarea>
<button id="send" class="primary">Send</button><button id="cancel" style="display:none">Cancel</button></div>
<script nonce="${nonce}" src="${js}"></script></body></html>`;
    view.webview.onDidReceiveMessage((m) => void this.onMessage(m).catch((e) => this.showError(e)));
    view.onDidDispose(() => {
      if (this.view !== view) return;
      this.view = null;
      this.ready = false;
      this.inFlight = new Set();
    });
  }

  private post(msg: unknown): void {
    if (this.view && this.ready) void this.view.webview.postMessage(msg);
  }

  private resetWebview(): void {
    if (!this.view || !this.ready) return;
    void this.view.webview.postMessage({
      type: 'reset',
      session: this.session,
      connection: this.streamState,
      perf: this.perf,
      mode: this.session ? undefined : (this.pendingMode ?? undefined),
      askBeforeEdits: this.session ? undefined : this.pendingAsk(),
    });
    // Replay in batches so a long session does not stall the view.
    for (let i = 0; i < this.log.length; i += 500) this.post({ type: 'events', events: this.log.slice(i, i + 500) });
  }

  /**
   * Events go to the webview in batches, a few on their way at a time: the
   * first after a quiet spell at once, the next at least BATCH_MS later and
   * only while fewer than MAX_IN_FLIGHT wait to be taken by the webview.
   * Each message costs the workbench a fixed amount on its way; posting
   * faster than it delivers only queues them behind each other while a turn
   * streams. Text deltas waiting together are sent as one (EventOutbox).
   */
  private forward(ev: ServerEvent): void {
    this.outbox.push(ev, this.perf ? Date.now() : 0);
    this.scheduleFlush();
  }

  private scheduleFlush(): void {
    if (this.flushTimer || this.inFlight.size >= Chat.MAX_IN_FLIGHT || !this.outbox.size) return;
    const wait = Math.max(0, this.lastPostMs + Chat.BATCH_MS - Date.now());
    this.flushTimer = setTimeout(() => this.flush(), wait);
  }

  private flush(): void {
    this.flushTimer = null;
    const view = this.view;
    const batch = this.outbox.take();
    // Not shown yet: the log is replayed when the webview says it is ready.
    if (!view || !this.ready || !batch.length) return;
    this.lastPostMs = Date.now();
    const n = ++this.batchNo;
    const inFlight = this.inFlight;
    inFlight.add(n);
    const msg: any = { type: 'events', events: batch.map((o) => o.ev) };
    if (this.perf) {
      msg.perf = batch.map((o) => o.perf);
      msg.postMs = this.lastPostMs;
    }
    // A message the workbench never answers (a webview going away) holds the
    // next batch back a second at most.
    const done = () => {
      if (!inFlight.delete(n) || inFlight !== this.inFlight) return;
      this.scheduleFlush();
    };
    const guard = setTimeout(done, 1000);
    view.webview.postMessage(msg).then(
      () => (clearTimeout(guard), done()),
      () => (clearTimeout(guard), done()),
    );
  }
  private batchNo = 0;
  private static readonly BATCH_MS = 40;
  private static readonly MAX_IN_FLIGHT = 4;
  private lastPostMs = 0;

  private async onMessage(m: any): Promise<void> {
    switch (m.type) {
      case 'ready':
        this.ready = true;
        this.resetWebview();
        break;
      case 'send':
        await this.send(m.text);
        break;
      case 'cancel':
        this.requireStream().cancel();
        break;
      case 'answer':
        this.requireStream().answer(m.questionId, m.selected ?? [], m.text ?? '');
        break;
      case 'planAction':
        await vscode.commands.executeCommand(
          m.action === 'approve' ? 'fwai.approvePlan' : m.action === 'redirect' ? 'fwai.redirectPlan' : 'fwai.openPlan',
        );
        break;
      case 'setMode':
        await this.setMode(m.mode);
        break;
      case 'setEditApproval':
        await this.setEditApproval(!!m.on);
        break;
      case 'showProposedDiff':
        await this.edits.showProposed(this, m.callId);
        break;
      case 'reviewTurn':
        await vscode.commands.executeCommand('fwai.reviewTurn', m.turnId);
        break;
      case 'compact':
        this.requireStream().compact();
        break;
      case 'openRef':
        await this.openRef(m.path, m.line, m.column);
        break;
      case 'insert': {
        const ed = vscode.window.activeTextEditor;
        if (!ed) throw new Error('no editor is active to insert the code into');
        await ed.edit((b) => b.replace(ed.selection, m.text));
        break;
      }
      case 'copy':
        await vscode.env.clipboard.writeText(m.text);
        void vscode.window.setStatusBarMessage('fwai: copied', 2000);
        break;
      case 'showDiff':
        await this.edits.showDiff(this, m.callId);
        break;
      case 'newSession':
        await vscode.commands.executeCommand('fwai.newSession');
        break;
      case 'perfReport':
        for (const w of this.perfWaiters.splice(0)) w(m);
        break;
    }
  }

  showError(e: unknown): void {
    const err = toFwaiError(e);
    void vscode.window.showErrorMessage(`fwai: ${shown(err)}`);
    this.out.appendLine(`error: ${err.codeName}: ${err.message}`);
  }

  // ---------------------------------------------------------------- sessions

  private requireStream(): SessionStream {
    if (!this.stream) throw new Error('no session is open');
    return this.stream;
  }

  /** Opens (attaches to) a session: its whole history, then the live tail. */
  async open(sessionId: string, stillWanted?: () => boolean): Promise<void> {
    const client = await this.conn.get();
    const info = await getSession(client, sessionId);
    if (stillWanted && !stillWanted()) return; // another session was opened meanwhile
    this.stream?.close();
    this.session = info;
    this.reopenId = null;
    this.pendingRoot = null;
    this.model = new SessionModel(info.id);
    this.model.mode = info.mode;
    this.model.askBeforeEdits = info.ask_before_edits;
    this.model.todos = info.todos ?? [];
    this.log.length = 0;
    this.outbox.take();
    const stream = new SessionStream(client, info.id, { beforeReconnect: () => this.conn.revive() });
    this.stream = stream;
    stream.on('event', (ev) => {
      if (this.stream !== stream) return;
      this.log.push(ev);
      const changes = this.model.apply(ev);
      this.forward(ev);
      this.eventEmitter.fire(ev);
      if (
        changes.some(
          (c) =>
            c.type === 'plan' ||
            c.type === 'question' ||
            c.type === 'mode' ||
            c.type === 'usage' ||
            (c.type === 'turn' && !c.added),
        )
      ) {
        this.changed.fire();
      }
    });
    stream.on('state', (s, detail) => {
      if (this.stream !== stream) return;
      this.streamState = s;
      this.post({ type: 'connection', state: s, detail });
      this.changed.fire();
    });
    stream.on('fatal', (e: FwaiError) => {
      if (this.stream !== stream) return;
      this.showError(e);
    });
    this.resetWebview();
    stream.start();
    await this.ctx.workspaceState.update('fwai.lastSession', info.id);
    this.changed.fire();
  }

  /** Leaves the current session; the next message starts a new one in `projectRoot`. */
  startNew(projectRoot: string): void {
    this.stream?.close();
    this.stream = null;
    this.session = null;
    this.pendingRoot = projectRoot;
    this.model = new SessionModel('');
    this.model.mode = this.pendingMode ?? '';
    this.model.askBeforeEdits = this.pendingAsk();
    this.log.length = 0;
    this.resetWebview();
    this.post({ type: 'focusInput' });
    this.changed.fire();
  }

  async send(text: string): Promise<string> {
    const cfg = vscode.workspace.getConfiguration('fwai');
    if (this.reopenId) {
      await this.reopen();
      if (this.reopenId) throw new Error(`not connected to fwaid: ${this.reopenError}`);
    }
    if (!this.session) {
      const root = this.pendingRoot ?? (await pickProjectRoot());
      if (!root) throw new Error('open a folder first: a session works on a project folder');
      const client = await this.conn.get();
      const s = await createSession(client, {
        title: text.slice(0, 80),
        projectRoot: root,
        provider: cfg.get<string>('provider') ?? '',
        model: cfg.get<string>('model') ?? '',
        mode: this.pendingMode ?? 'act',
        askBeforeEdits: this.pendingAsk(),
      });
      this.pendingMode = null;
      this.pendingAskBeforeEdits = null;
      await this.open(s.id);
      await waitOpen(this.stream!);
    }
    return this.requireStream().sendMessage(text, {
      provider: cfg.get<string>('provider') || undefined,
      model: cfg.get<string>('model') || undefined,
    });
  }

  pendingMode: 'plan' | 'act' | null = null;
  /** Ask before edits for the next session (null: the fwai.askBeforeEdits setting). */
  pendingAskBeforeEdits: boolean | null = null;

  private pendingAsk(): boolean {
    return (
      this.pendingAskBeforeEdits ?? vscode.workspace.getConfiguration('fwai').get<boolean>('askBeforeEdits', false)
    );
  }

  /** Ask before edits on or off: the open session's (between turns), or the next one's. */
  async setEditApproval(on: boolean): Promise<void> {
    if (!this.session) {
      this.pendingAskBeforeEdits = on;
      this.model.askBeforeEdits = on;
      this.post({ type: 'mode', mode: this.model.mode, askBeforeEdits: on });
      this.changed.fire();
      return;
    }
    if (this.model.running) throw new Error('a turn is running: turn asking before edits on or off after it ends');
    this.requireStream().setEditApproval(on);
  }

  async setMode(mode: 'plan' | 'act'): Promise<void> {
    if (!this.session) {
      this.pendingMode = mode;
      this.model.mode = mode;
      this.post({ type: 'mode', mode, askBeforeEdits: this.model.askBeforeEdits });
      this.changed.fire();
      void vscode.window.setStatusBarMessage(`fwai: the next session starts in ${mode} mode`, 3000);
      return;
    }
    this.requireStream().setMode(mode);
  }

  projectRoot(): string | null {
    return this.session?.project_root ?? this.pendingRoot;
  }

  async openRef(p: string, line: number, column = 1): Promise<void> {
    const candidates: string[] = [];
    if (path.isAbsolute(p)) candidates.push(p);
    else {
      const root = this.projectRoot();
      if (root) candidates.push(path.join(root, p));
      for (const f of vscode.workspace.workspaceFolders ?? []) candidates.push(path.join(f.uri.fsPath, p));
    }
    const hit = candidates.find((c) => fs.existsSync(c));
    if (!hit) throw new Error(`${p}: not found in the project`);
    const pos = new vscode.Position(Math.max(0, line - 1), Math.max(0, column - 1));
    await vscode.window.showTextDocument(vscode.Uri.file(hit), {
      selection: new vscode.Range(pos, pos),
      preview: true,
      viewColumn: this.codeColumn(),
    });
  }

  // ---------------------------------------------------------------- measures

  setPerf(enable: boolean): void {
    this.perf = enable;
    this.post({ type: 'perf', enable });
  }
  perfReport(): Promise<any> {
    return new Promise((resolve) => {
      this.perfWaiters.push(resolve);
      this.post({ type: 'perfReport' });
    });
  }

  dispose(): void {
    this.stream?.close();
    this.view?.dispose();
    for (const d of this.disposables) d.dispose();
  }
}

function waitOpen(s: SessionStream): Promise<void> {
  if (s.state === 'open') return Promise.resolve();
  return new Promise((resolve, reject) => {
    const on = (st: StreamState, detail: string) => {
      if (st === 'open') {
        s.off('state', on);
        resolve();
      } else if (st === 'closed') {
        s.off('state', on);
        reject(new Error(detail || 'the session stream closed'));
      }
    };
    s.on('state', on);
  });
}

/** The folder a new session works on: the active editor's, the only one, or the one the person picks. */
export async function pickProjectRoot(): Promise<string | null> {
  const folders = vscode.workspace.workspaceFolders ?? [];
  if (!folders.length) return null;
  const active = vscode.window.activeTextEditor?.document.uri;
  const owner = active ? vscode.workspace.getWorkspaceFolder(active) : undefined;
  if (owner) return owner.uri.fsPath;
  if (folders.length === 1) return folders[0].uri.fsPath;
  const pick = await vscode.window.showWorkspaceFolderPick({ placeHolder: 'Project folder for the new fwai session' });
  return pick?.uri.fsPath ?? null;
}
