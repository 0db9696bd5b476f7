// A turn's changes reviewed as diffs: every file that differs from the
// checkpoint fwaid took before the turn (so also what bash or a build
// changed), each opened as "before the turn ↔ now", kept or reverted per file
// (a file's revert is fwaid's rewind of that one file, as the session's
// account) and per hunk (the hunk's lines put back in the editor and saved).
// Hunks under review carry Keep / Revert lenses in the file's editor.
import * as path from 'node:path';
import * as vscode from 'vscode';
import { Hunk, hunksOf, listCheckpoints, readCheckpointFile, rewindSession, withHunkReverted } from '../client';
import type { Connection } from './connection';
import type { Chat } from './chat';

export const REVIEW_SCHEME = 'fwai-turn-before';

/** One file under review. */
export interface Reviewed {
  path: string; // relative to the project
  abs: string;
  action: string; // restore: changed in the turn; create: deleted in it; delete: created in it
  before: string; // its text before the turn ('' when it did not exist)
  existed: boolean;
  kept: Set<string>; // hunks kept, by their text
}

interface Review {
  sessionId: string;
  root: string;
  checkpoint: string; // the checkpoint's number
  turnId: string;
  files: Map<string, Reviewed>; // by relative path
}

export class TurnReview implements vscode.TextDocumentContentProvider, vscode.CodeLensProvider, vscode.Disposable {
  review: Review | null = null;
  private readonly changed = new vscode.EventEmitter<void>();
  readonly onDidChangeCodeLenses = this.changed.event;
  private readonly disposables: vscode.Disposable[] = [];

  constructor(
    private readonly conn: Connection,
    private readonly chat: Chat,
  ) {
    this.disposables.push(
      vscode.workspace.registerTextDocumentContentProvider(REVIEW_SCHEME, this),
      vscode.languages.registerCodeLensProvider({ scheme: 'file' }, this),
      vscode.workspace.onDidChangeTextDocument((e) => this.files().has(e.document.uri.fsPath) && this.changed.fire()),
      this.changed,
    );
  }

  private files(): Map<string, Reviewed> {
    const byAbs = new Map<string, Reviewed>();
    for (const f of this.review?.files.values() ?? []) byAbs.set(f.abs, f);
    return byAbs;
  }

  provideTextDocumentContent(uri: vscode.Uri): string {
    if (uri.query === 'deleted') return '';
    return this.review?.files.get(uri.path.slice(1))?.before ?? '';
  }

  /** Reviews a turn in a picker: each file opens as a diff; Keep / Revert per file (and per hunk in its editor). */
  async pick(turnId?: string): Promise<void> {
    const files = await this.start(turnId);
    if (!files.length) {
      void vscode.window.showInformationMessage(
        `fwai: turn ${this.review?.turnId} changed no file (or each was changed back since)`,
      );
      return;
    }
    const qp = vscode.window.createQuickPick<vscode.QuickPickItem & { rel: string }>();
    const keep = { iconPath: new vscode.ThemeIcon('check'), tooltip: 'Keep this file as the turn left it' };
    const revert = { iconPath: new vscode.ThemeIcon('discard'), tooltip: 'Revert this file to before the turn' };
    const items = () =>
      [...(this.review?.files.values() ?? [])].map((f) => ({
        label: f.path,
        description:
          f.action === 'delete' ? 'created in the turn' : f.action === 'create' ? 'deleted in the turn' : 'changed',
        rel: f.path,
        buttons: [keep, revert],
      }));
    qp.title = `Changes of turn ${this.review?.turnId} (before the turn ↔ now)`;
    qp.placeholder = 'Open a file as a diff; Keep or Revert it with its buttons (hunks: in its editor)';
    qp.ignoreFocusOut = true;
    qp.items = items();
    qp.onDidAccept(() => {
      const it = qp.selectedItems[0];
      if (it) void this.openDiff(it.rel).catch((e) => void vscode.window.showErrorMessage(`fwai: ${e.message}`));
    });
    qp.onDidTriggerItemButton(async (e) => {
      try {
        if (e.button === keep) this.keepFile(e.item.rel);
        else await this.revertFile(e.item.rel);
      } catch (err: any) {
        void vscode.window.showErrorMessage(`fwai: ${err.message}`);
      }
      qp.items = items();
      if (!qp.items.length) qp.hide();
    });
    qp.onDidHide(() => qp.dispose());
    qp.show();
  }

  /**
   * Starts reviewing turn `turnId` of the open session (default: its last
   * finished turn): the files that differ from the checkpoint before it.
   */
  async start(turnId?: string): Promise<Reviewed[]> {
    const s = this.chat.session;
    if (!s) throw new Error('open a session first: its turns are what is reviewed');
    if (!s.project_root) throw new Error(`session ${s.id} has no project: no file of it to review`);
    const turns = this.chat.model.turns.filter((t) => !t.running);
    const turn = turnId ? this.chat.model.turnById.get(turnId) : turns[turns.length - 1];
    if (!turn) throw new Error('no finished turn to review yet');
    const client = await this.conn.get();
    const cp = (await listCheckpoints(client, s.id)).find((c) => c.turn_id === turn.id);
    if (!cp) throw new Error(`no checkpoint was taken before turn ${turn.id}: its changes cannot be told apart`);
    const to = String(cp.seq);
    const plan = await rewindSession(client, s.id, { to, files: true, boards: false, dryRun: true });
    const files = new Map<string, Reviewed>();
    for (const f of plan.files) {
      const then = await readCheckpointFile(client, s.id, to, f.path);
      files.set(f.path, {
        path: f.path,
        abs: path.join(s.project_root, f.path),
        action: f.action,
        before: then.kept ? then.text : '',
        existed: then.kept,
        kept: new Set(),
      });
    }
    this.review = { sessionId: s.id, root: s.project_root, checkpoint: to, turnId: turn.id, files };
    this.changed.fire();
    return [...files.values()];
  }

  /** Opens "before the turn ↔ now" for one file under review. */
  async openDiff(rel: string): Promise<void> {
    const f = this.require(rel);
    const left = vscode.Uri.from({ scheme: REVIEW_SCHEME, path: `/${f.path}`, query: this.review!.checkpoint });
    const right = f.action === 'create' ? left.with({ query: 'deleted' }) : vscode.Uri.file(f.abs);
    const what =
      f.action === 'delete'
        ? 'created in the turn'
        : f.action === 'create'
          ? 'deleted in the turn'
          : 'before the turn ↔ now';
    await vscode.commands.executeCommand('vscode.diff', left, right, `${f.path}: ${what}`, {
      preview: false,
      viewColumn: this.chat.codeColumn(),
    });
  }

  /** The hunks of a file under review not yet kept, as the file is now. */
  async hunks(rel: string): Promise<Hunk[]> {
    const f = this.require(rel);
    return hunksOf(f.before, (await textNow(f.abs)).text).filter((h) => !f.kept.has(hunkKey(h)));
  }

  /** Keeps a hunk: it stays and is no longer shown for review. */
  async keepHunk(rel: string, index: number): Promise<void> {
    const f = this.require(rel);
    const h = (await this.hunks(rel))[index];
    if (!h) throw new Error(`${rel}: no hunk ${index + 1} to keep`);
    f.kept.add(hunkKey(h));
    await this.settle(f);
  }

  /**
   * Reverts a hunk: its lines as they were before the turn. An editor holding
   * unsaved text of the file gets the change and is saved; otherwise the file
   * is rewritten on disk (an open editor reloads it, however late its watcher
   * says the file changed).
   */
  async revertHunk(rel: string, index: number): Promise<void> {
    const f = this.require(rel);
    const { text, dirty } = await textNow(f.abs);
    const h = hunksOf(f.before, text).filter((x) => !f.kept.has(hunkKey(x)))[index];
    if (!h) throw new Error(`${rel}: no hunk ${index + 1} to revert`);
    let back: string;
    try {
      back = withHunkReverted(f.before, text, h);
    } catch (e) {
      throw new Error(`${rel}: ${(e as Error).message}`);
    }
    if (dirty) {
      const edit = new vscode.WorkspaceEdit();
      edit.replace(dirty.uri, new vscode.Range(new vscode.Position(0, 0), dirty.positionAt(text.length)), back);
      if (!(await vscode.workspace.applyEdit(edit))) throw new Error(`${rel}: the editor refused the revert`);
      if (!(await dirty.save())) throw new Error(`${rel}: reverted in the editor, but it could not be saved`);
    } else {
      await vscode.workspace.fs.writeFile(vscode.Uri.file(f.abs), Buffer.from(back, 'utf8'));
    }
    await this.settle(f, back);
  }

  /** Keeps the whole file as the turn left it. */
  keepFile(rel: string): void {
    this.require(rel);
    this.review!.files.delete(rel);
    this.changed.fire();
  }

  /** Puts the whole file back as it was before the turn (fwaid restores it as the session's account). */
  async revertFile(rel: string): Promise<void> {
    const f = this.require(rel);
    const r = this.review!;
    // An editor holding unsaved text of it would write it back over the restore.
    await unsavedEditorOf(f.abs)?.save();
    await rewindSession(await this.conn.get(), r.sessionId, {
      to: r.checkpoint,
      files: true,
      boards: false,
      paths: [f.path],
    });
    r.files.delete(rel);
    this.changed.fire();
  }

  /** A file whose every hunk was kept or reverted leaves the review. */
  private async settle(f: Reviewed, text?: string): Promise<void> {
    const now = text ?? (await textNow(f.abs)).text;
    if (hunksOf(f.before, now).every((h) => f.kept.has(hunkKey(h)))) this.review?.files.delete(f.path);
    this.changed.fire();
  }

  private require(rel: string): Reviewed {
    const f = this.review?.files.get(rel);
    if (!f) throw new Error(`${rel} is not under review (review a turn's changes first)`);
    return f;
  }

  provideCodeLenses(doc: vscode.TextDocument): vscode.CodeLens[] {
    const f = this.files().get(doc.uri.fsPath);
    if (!f) return [];
    const out: vscode.CodeLens[] = [];
    const hunks = hunksOf(f.before, doc.getText()).filter((h) => !f.kept.has(hunkKey(h)));
    hunks.forEach((h, i) => {
      const line = Math.min(h.newStart, Math.max(0, doc.lineCount - 1));
      const range = new vscode.Range(line, 0, line, 0);
      const what = h.newLines.length ? (h.oldLines.length ? 'changed' : 'added') : 'removed';
      out.push(
        new vscode.CodeLens(range, {
          title: `fwai: ${what} in the turn — Keep`,
          command: 'fwai.keepHunk',
          arguments: [f.path, i],
        }),
        new vscode.CodeLens(range, { title: 'Revert', command: 'fwai.revertHunk', arguments: [f.path, i] }),
      );
    });
    return out;
  }

  dispose(): void {
    for (const d of this.disposables) d.dispose();
  }
}

/** The editor document holding unsaved text of a file, if any. */
function unsavedEditorOf(abs: string): vscode.TextDocument | undefined {
  return vscode.workspace.textDocuments.find((d) => d.uri.fsPath === abs && d.isDirty);
}

/** A file's text as the user has it: an editor's unsaved text, else the file on disk. */
async function textNow(abs: string): Promise<{ text: string; dirty?: vscode.TextDocument }> {
  const dirty = unsavedEditorOf(abs);
  if (dirty) return { text: dirty.getText(), dirty };
  try {
    return { text: Buffer.from(await vscode.workspace.fs.readFile(vscode.Uri.file(abs))).toString('utf8') };
  } catch (e) {
    if (e instanceof vscode.FileSystemError && e.code === 'FileNotFound') return { text: '' };
    throw e;
  }
}

/** A hunk's identity: its text and where it stands in the file (two identical hunks differ). */
function hunkKey(h: Hunk): string {
  return JSON.stringify([h.oldStart, h.oldLines, h.newLines]);
}
