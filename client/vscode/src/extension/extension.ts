// fwai for VS Code: a thin client of fwaid. Sessions, the sub-agent tree,
// plans, boards, serial, skills, datasheets and evidence, in the same sessions
// the CLI sees.
const loadedAt = Date.now();

import * as vscode from 'vscode';
import {
  SessionInfo,
  captureFault,
  deleteSession,
  listCheckpoints,
  memoryReport,
  otaStatus,
  rewindSession,
  saveCapture,
  sbom,
  selfTest,
} from '../client';
import { Boards, Device } from './boards';
import { Chat, pickProjectRoot } from './chat';
import { Connection, TOKEN_KEY } from './connection';
import { Edits } from './edits';
import { Evidence } from './evidence';
import { openCaptureReport } from './faults';
import { Knowledge } from './knowledge';
import { Plans } from './plans';
import { TurnReview } from './review';
import { SessionsView } from './sessionsView';
import { shareCommand, unshareCommand } from './share';
import { Registers } from './registers';
import { Skills } from './skills';
import { StatusBar } from './status';

/** What the extension exports (for other extensions and the test suites). */
export interface FwaiApi {
  activationMs: number;
  connection: Connection;
  chat: Chat;
  sessions: SessionsView;
  boards: Boards;
  skills: Skills;
  knowledge: Knowledge;
  evidence: Evidence;
  edits: Edits;
  registers: Registers;
  review: TurnReview;
}

export function activate(ctx: vscode.ExtensionContext): FwaiApi {
  const out = vscode.window.createOutputChannel('fwai');
  const conn = new Connection(ctx, out);
  const edits = new Edits();
  const chat = new Chat(ctx, conn, edits, out);
  const sessions = new SessionsView(conn, chat);
  const boards = new Boards(conn, out);
  const skills = new Skills(conn);
  const registers = new Registers(conn);
  ctx.subscriptions.push(registers);
  const knowledge = new Knowledge(conn, out);
  const evidence = new Evidence(conn);
  const plans = new Plans(chat);
  const review = new TurnReview(conn, chat);
  ctx.subscriptions.push(review);
  const status = new StatusBar(conn, chat, boards);
  ctx.subscriptions.push(out, conn, edits, chat, sessions, boards, skills, knowledge, evidence, plans, status);

  ctx.subscriptions.push(
    vscode.window.registerWebviewPanelSerializer('fwai.chat', chat),
    withMessage(vscode.window.createTreeView('fwai.sessions', { treeDataProvider: sessions }), sessions),
    withMessage(vscode.window.createTreeView('fwai.boards', { treeDataProvider: boards }), boards),
    vscode.window.createTreeView('fwai.skills', { treeDataProvider: skills }),
    withMessage(vscode.window.createTreeView('fwai.evidence', { treeDataProvider: evidence }), evidence),
  );

  // Errors of commands become one message naming what failed.
  const command = (id: string, fn: (...args: any[]) => unknown) =>
    ctx.subscriptions.push(
      vscode.commands.registerCommand(id, async (...args: any[]) => {
        try {
          return await fn(...args);
        } catch (e) {
          chat.showError(e);
          return undefined;
        }
      }),
    );

  command('fwai.newSession', async () => {
    const root = await pickProjectRoot();
    if (!root) throw new Error('open a folder first: a session works on a project folder');
    chat.startNew(root);
    chat.show();
  });
  command('fwai.attachSession', async (id?: string) => {
    if (!id) {
      await sessions.refresh();
      const pick = await vscode.window.showQuickPick(
        sessions.sessions.map((s) => ({
          label: s.title || s.id,
          description: `${s.id} · ${s.mode}`,
          detail: s.project_root,
          id: s.id,
        })),
        { placeHolder: 'Session to open' },
      );
      id = pick?.id;
    }
    if (!id) return;
    await chat.open(id);
    chat.show();
  });
  command('fwai.openChat', () => chat.show());
  command('fwai.refreshSessions', () => sessions.refresh());
  command('fwai.deleteSession', async (node?: { s: SessionInfo }) => {
    const s = node?.s;
    if (!s) return;
    const ok = await vscode.window.showWarningMessage(
      `Delete the session "${s.title || s.id}" and its history?`,
      { modal: true },
      'Delete',
    );
    if (ok !== 'Delete') return;
    await deleteSession(await conn.get(), s.id);
    if (chat.session?.id === s.id) chat.startNew(s.project_root);
    await sessions.refresh();
  });
  command('fwai.shareSession', (node?: { s: SessionInfo }) => shareCommand(sessions, node?.s ?? chat.session));
  command('fwai.unshareSession', (node?: { s: SessionInfo }) => unshareCommand(sessions, node?.s ?? chat.session));
  command('fwai.rewindSession', async (node?: { s: SessionInfo }) => {
    const id = node?.s.id ?? chat.session?.id;
    if (!id) throw new Error('open a session first: a rewind goes back to one of its checkpoints');
    const client = await conn.get();
    const cps = await listCheckpoints(client, id);
    if (!cps.length) throw new Error(`session ${id} has no checkpoints yet: one is taken before each turn`);
    const pick = await vscode.window.showQuickPick(
      cps
        .slice()
        .reverse()
        .map((c) => ({
          label: `${c.seq}: before turn ${c.turn_id}`,
          description: new Date(c.time_us / 1000).toLocaleString(),
          detail: `${c.files} files${Object.keys(c.boards).length ? ` · boards ${Object.keys(c.boards).join(', ')}` : ''}`,
          seq: String(c.seq),
        })),
      { placeHolder: 'Checkpoint to rewind to' },
    );
    if (!pick) return;
    const plan = await rewindSession(client, id, { to: pick.seq, conversation: true, dryRun: true });
    const lines = [
      ...plan.files.map((f) => `${f.action} ${f.path}`),
      ...plan.boards
        .filter((b) => b.action === 'flash')
        .map((b) => `flash ${b.board} back to ${b.then_sha256.slice(0, 12)}`),
    ];
    const shown = lines.slice(0, 20).join('\n') + (lines.length > 20 ? `\n… and ${lines.length - 20} more` : '');
    const choice = await vscode.window.showWarningMessage(
      `Rewind to checkpoint ${pick.seq}?`,
      { modal: true, detail: shown || 'No file or board differs.' },
      'Rewind',
      'Rewind and Cut the Conversation',
    );
    if (!choice) return;
    const done = await rewindSession(client, id, { to: pick.seq, conversation: choice !== 'Rewind' });
    void vscode.window.showInformationMessage(
      `fwai: rewound to checkpoint ${done.checkpoint?.seq}: ${done.files.length} files, ${done.boards.filter((b) => b.action === 'flash').length} boards flashed`,
    );
  });
  command('fwai.copySessionId', async (node?: { s: SessionInfo }) => node && vscode.env.clipboard.writeText(node.s.id));
  command('fwai.cancelTurn', () => chat.stream?.cancel());
  command('fwai.setModePlan', () => chat.setMode('plan'));
  command('fwai.setModeAct', () => chat.setMode('act'));
  command('fwai.compact', () => chat.stream?.compact());
  command('fwai.showTurnChanges', async () => {
    const root = chat.projectRoot();
    const changes = edits.changesOf(chat);
    if (!root || !changes.length) {
      void vscode.window.showInformationMessage('fwai: the last turn changed no file');
      return;
    }
    const pick = await vscode.window.showQuickPick(
      changes.map((c) => ({ label: c.path, description: `${c.tool}${c.created ? ' (new file)' : ''}`, c })),
      { placeHolder: 'Files the last turn changed' },
    );
    if (pick) await edits.open(root, pick.c, pick.c.tool, chat.codeColumn());
  });

  command('fwai.reviewTurn', (turnId?: string) => review.pick(typeof turnId === 'string' ? turnId : undefined));
  command('fwai.keepHunk', (rel: string, i: number) => review.keepHunk(rel, i));
  command('fwai.revertHunk', (rel: string, i: number) => review.revertHunk(rel, i));
  command('fwai.toggleAskBeforeEdits', () => chat.setEditApproval(!chat.model.askBeforeEdits));

  command('fwai.refreshBoards', () => boards.refresh());
  command('fwai.leaseBoard', (d?: Device) => boards.lease(d));
  command('fwai.renewLease', (d?: Device) => boards.renew(d));
  command('fwai.releaseBoard', (d?: Device) => boards.release(d));
  command('fwai.flashBoard', async (d?: Device, approved?: unknown) => {
    const root = chat.projectRoot() ?? (await pickProjectRoot());
    if (!root) throw new Error('open the firmware project folder first');
    // Only an explicit boolean (from another extension or a test) skips the prompt;
    // a view passes its selection as the second argument.
    return boards.flash(d?.id ? d : undefined, root, typeof approved === 'boolean' ? approved : undefined);
  });
  command('fwai.openSerial', (d?: Device) => boards.openSerial(d));
  command('fwai.selfTest', async (d?: Device) => {
    if (!d?.id) return;
    const client = await conn.get();
    const report = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `fwai: self-test ${d.id}` },
      () => selfTest(client, d.id),
    );
    out.appendLine(report);
    out.show(true);
    await boards.refresh();
  });

  // Fault captures: a held board's stopped core kept in the project, and any
  // capture opened as a report (decoded offline by the fwai CLI).
  command('fwai.captureFault', async (d?: Device, into?: unknown) => {
    const board = d?.id ? d : undefined;
    const id = board?.id ?? (await vscode.window.showInputBox({ prompt: 'Board to capture' }));
    if (!id) return undefined;
    // Only an explicit folder (from another extension or a test) is taken as
    // given; a view passes its selection as the second argument.
    const root = typeof into === 'string' ? into : (chat.projectRoot() ?? (await pickProjectRoot()));
    if (!root) throw new Error('open the firmware project folder first: the capture is kept in it');
    const client = await conn.get();
    const capture = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `fwai: capturing ${id}` },
      () => captureFault(client, id, boards.heldByMe(id)?.lease_id ?? ''),
    );
    const file = saveCapture(root, id, capture);
    out.appendLine(`fwai: captured ${id} into ${file}`);
    return openCaptureReport(file);
  });
  command('fwai.openFaultCapture', (uri?: vscode.Uri) => openCaptureReport(uri?.fsPath));

  command('fwai.refreshSkills', () => skills.refresh());
  command('fwai.runSkill', async (node?: { folder: vscode.WorkspaceFolder; skill: { name: string } }) => {
    let folder = node?.folder;
    let name = node?.skill?.name;
    if (!folder) folder = (await vscode.window.showWorkspaceFolderPick()) ?? undefined;
    if (!folder) return;
    if (!name) {
      const list = await skills.list(folder);
      name = (await vscode.window.showQuickPick(list.map((s) => ({ label: s.name, description: s.description }))))
        ?.label;
    }
    if (!name) return;
    const tasks = await vscode.tasks.fetchTasks({ type: 'fwai' });
    const same = (t: vscode.Task) =>
      typeof t.scope === 'object' && (t.scope as vscode.WorkspaceFolder).uri.toString() === folder!.uri.toString();
    const task =
      tasks.find((t) => t.definition.skill === name && same(t)) ??
      skills.makeTask(folder, { type: 'fwai', skill: name });
    await vscode.tasks.executeTask(task);
  });

  command('fwai.searchDatasheets', (q?: string) => knowledge.searchCommand(q));
  command('fwai.kbAdd', async (uri?: vscode.Uri, uris?: vscode.Uri[]) => {
    const list = uris?.length
      ? uris
      : uri
        ? [uri]
        : await vscode.window.showOpenDialog({ canSelectMany: true, canSelectFolders: true, openLabel: 'Add to fwai' });
    if (list?.length) return knowledge.add(list);
  });

  // The project's firmware as fwaid reports it, opened as documents.
  const show = async (content: string, language: string) =>
    vscode.window.showTextDocument(await vscode.workspace.openTextDocument({ content, language }), { preview: false });
  const projectRootOrPick = async () => {
    const root = chat.projectRoot() ?? (await pickProjectRoot());
    if (!root) throw new Error('open the firmware project folder first');
    return root;
  };
  command('fwai.memoryReport', async () => {
    const root = await projectRootOrPick();
    const r = await memoryReport(await conn.get(), root);
    return show(r.text, 'plaintext');
  });
  command('fwai.sbom', async () => {
    const root = await projectRootOrPick();
    return show(JSON.stringify(await sbom(await conn.get(), root), null, 2), 'json');
  });
  command('fwai.checkRegisters', async () => {
    const root = await projectRootOrPick();
    const r = await registers.check(root);
    if (!r) return;
    const c = r.checked;
    const msg = `fwai: ${c.files} file(s), ${c.accesses} register accesses against ${c.svd}: ${c.errors} error(s), ${c.warnings} warning(s)`;
    return c.errors
      ? vscode.window.showErrorMessage(`${msg} (see Problems)`)
      : vscode.window.showInformationMessage(msg);
  });
  command('fwai.otaStatus', async () => show(JSON.stringify(await otaStatus(await conn.get()), null, 2), 'json'));

  command('fwai.refreshEvidence', () => evidence.refresh());
  command('fwai.openEvidence', (runId: string) => evidence.open(runId));
  command('fwai.verifyEvidence', () => evidence.verifyLog());
  command('fwai.exportSarif', () => evidence.exportSarif());
  command('fwai.exportHtml', () => evidence.showHtml());

  // The token as an argument (a script, a test) or typed in.
  command('fwai.setToken', async (given?: unknown) => {
    const t =
      typeof given === 'string'
        ? given
        : await vscode.window.showInputBox({
            prompt: "Bearer token for the lab daemon (kept in VS Code's secret storage)",
            password: true,
            ignoreFocusOut: true,
          });
    if (t) await ctx.secrets.store(TOKEN_KEY, t.trim());
  });
  command('fwai.clearToken', () => ctx.secrets.delete(TOKEN_KEY));
  command('fwai.reconnect', () => conn.restart().then(() => conn.get()));
  command('fwai.showLog', () => out.show());

  // Evidence grows with every turn, skill run and flash.
  ctx.subscriptions.push(
    chat.onEvent((ev) => ev.payload === 'turn_finished' && void evidence.refresh()),
    vscode.tasks.onDidEndTask((e) => e.execution.task.definition.type === 'fwai' && void evidence.refresh()),
    // A remote workspace's folders can arrive after activation; folders are added and removed.
    vscode.workspace.onDidChangeWorkspaceFolders(() => {
      void skills.refresh();
      void sessions.refresh();
    }),
  );

  // The first run shows the chat beside the code; later it is where the person left it.
  if (!ctx.globalState.get<boolean>('fwai.chatShown')) {
    chat.show(true);
    void ctx.globalState.update('fwai.chatShown', true);
  }

  // Connect now (starting fwaid if allowed) and reopen this workspace's last session.
  void conn
    .get()
    .then(async () => {
      void sessions.refresh();
      void boards.refresh();
      void evidence.refresh();
      const last = ctx.workspaceState.get<string>('fwai.lastSession');
      if (last && !chat.session) await chat.open(last).catch(() => undefined);
    })
    .catch(() => undefined);

  const api: FwaiApi = {
    activationMs: Date.now() - loadedAt,
    connection: conn,
    chat,
    sessions,
    boards,
    skills,
    knowledge,
    evidence,
    edits,
    registers,
    review,
  };
  out.appendLine(
    `fwai ${ctx.extension.packageJSON.version} activated in ${api.activationMs} ms (VS Code ${vscode.version}, ${vscode.env.appName})`,
  );
  return api;
}

export function deactivate(): void {}

/**
 * A view whose list could not be read says why above it, wrapped, in full
 * (a row would cut the advice off); it follows every redraw.
 */
function withMessage<T>(
  view: vscode.TreeView<T>,
  provider: { readonly message: string; readonly onDidChangeTreeData: vscode.Event<T | undefined> },
): vscode.Disposable {
  const follow = provider.onDidChangeTreeData(() => {
    view.message = provider.message || undefined;
  });
  view.message = provider.message || undefined;
  return vscode.Disposable.from(follow, view);
}
