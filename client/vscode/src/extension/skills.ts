// Skills: the project's skills in a tree and as VS Code tasks (type `fwai`).
// A run streams into the task's terminal; its typed diagnostics go to the
// Problems panel at file:line; progress shows in a notification.
import * as path from 'node:path';
import * as vscode from 'vscode';
import { Diagnostic, SkillEvent, SkillInfo, listSkills, runSkill } from '../client';
import { Connection, shown } from './connection';

export type { SkillInfo } from '../client';

type Node =
  | { kind: 'folder'; folder: vscode.WorkspaceFolder }
  | { kind: 'skill'; folder: vscode.WorkspaceFolder; skill: SkillInfo }
  | { kind: 'message'; text: string };

export interface FwaiTaskDefinition extends vscode.TaskDefinition {
  type: 'fwai';
  skill: string;
  vars?: Record<string, string>;
  board?: string;
  approveFlash?: boolean;
}

export class Skills implements vscode.TreeDataProvider<Node>, vscode.TaskProvider, vscode.Disposable {
  private readonly changed = new vscode.EventEmitter<Node | undefined>();
  readonly onDidChangeTreeData = this.changed.event;
  readonly diagnostics = vscode.languages.createDiagnosticCollection('fwai');
  private readonly cache = new Map<string, SkillInfo[]>();
  private error = '';
  /** The last run's outcome per skill (for tests and the tree). */
  readonly lastRun = new Map<string, { ok: boolean; runId: string; diagnostics: Diagnostic[] }>();
  private disposables: vscode.Disposable[] = [];

  constructor(private readonly conn: Connection) {
    this.disposables.push(vscode.tasks.registerTaskProvider('fwai', this), this.diagnostics);
  }

  async list(folder: vscode.WorkspaceFolder): Promise<SkillInfo[]> {
    const client = await this.conn.get();
    const skills = await listSkills(client, folder.uri.fsPath);
    this.cache.set(folder.uri.fsPath, skills);
    return skills;
  }

  async refresh(): Promise<void> {
    this.cache.clear();
    this.error = '';
    this.changed.fire(undefined);
  }

  async getChildren(n?: Node): Promise<Node[]> {
    const folders = vscode.workspace.workspaceFolders ?? [];
    if (!n) {
      if (!folders.length) return [{ kind: 'message', text: 'Open a project folder to see its skills' }];
      if (folders.length > 1) return folders.map((folder) => ({ kind: 'folder', folder }));
      n = { kind: 'folder', folder: folders[0] };
    }
    if (n.kind !== 'folder') return [];
    try {
      const folder = n.folder;
      const skills = this.cache.get(folder.uri.fsPath) ?? (await this.list(folder));
      return skills.map((skill) => ({ kind: 'skill', folder, skill }));
    } catch (e) {
      this.error = shown(e);
      return [{ kind: 'message', text: this.error }];
    }
  }

  getTreeItem(n: Node): vscode.TreeItem {
    if (n.kind === 'message') return new vscode.TreeItem(n.text);
    if (n.kind === 'folder') {
      const it = new vscode.TreeItem(n.folder.name, vscode.TreeItemCollapsibleState.Expanded);
      it.iconPath = new vscode.ThemeIcon('folder');
      return it;
    }
    const s = n.skill;
    const it = new vscode.TreeItem(s.name);
    const last = this.lastRun.get(`${n.folder.uri.fsPath}\0${s.name}`);
    it.description = `${s.builtin ? 'built-in' : path.basename(s.source)}${last ? (last.ok ? ' · ✓ last run' : ' · ✗ last run') : ''}`;
    it.tooltip = new vscode.MarkdownString(
      `**${s.name}** — ${s.description}\n\nsteps: ${s.steps.join(', ')}${s.flashes ? '\n\nflashes a board (asks first)' : ''}`,
    );
    it.iconPath = new vscode.ThemeIcon(s.flashes ? 'zap' : 'play-circle');
    it.contextValue = 'skill';
    it.command = { command: 'fwai.runSkill', title: 'Run', arguments: [n] };
    return it;
  }

  // ---------------------------------------------------------------- tasks

  async provideTasks(): Promise<vscode.Task[]> {
    const out: vscode.Task[] = [];
    for (const folder of vscode.workspace.workspaceFolders ?? []) {
      let skills: SkillInfo[];
      try {
        skills = this.cache.get(folder.uri.fsPath) ?? (await this.list(folder));
      } catch {
        continue;
      }
      for (const s of skills) out.push(this.makeTask(folder, { type: 'fwai', skill: s.name }));
    }
    return out;
  }

  resolveTask(task: vscode.Task): vscode.Task | undefined {
    const def = task.definition as FwaiTaskDefinition;
    if (!def.skill) return undefined;
    const folder =
      typeof task.scope === 'object' ? (task.scope as vscode.WorkspaceFolder) : vscode.workspace.workspaceFolders?.[0];
    if (!folder) return undefined;
    return this.makeTask(folder, def, task);
  }

  makeTask(folder: vscode.WorkspaceFolder, def: FwaiTaskDefinition, base?: vscode.Task): vscode.Task {
    const exec = new vscode.CustomExecution(async () => this.pty(folder, def));
    const t = new vscode.Task(def, folder, base?.name ?? def.skill, 'fwai', exec, []);
    if (def.skill === 'build') t.group = vscode.TaskGroup.Build;
    if (def.skill === 'test') t.group = vscode.TaskGroup.Test;
    t.presentationOptions = { reveal: vscode.TaskRevealKind.Always, clear: true };
    return t;
  }

  /** Runs the skill in a task terminal. */
  private pty(folder: vscode.WorkspaceFolder, def: FwaiTaskDefinition): vscode.Pseudoterminal {
    const write = new vscode.EventEmitter<string>();
    const close = new vscode.EventEmitter<number>();
    let cancel: (() => void) | null = null;
    return {
      onDidWrite: write.event,
      onDidClose: close.event,
      open: () => {
        void this.run(
          folder,
          def,
          (line) => write.fire(line.replace(/\n/g, '\r\n') + '\r\n'),
          (c) => (cancel = c),
        ).then((r) => close.fire(r.ok ? 0 : 1));
      },
      close: () => cancel?.(),
    };
  }

  /**
   * Runs a skill: output to `print`, diagnostics to Problems (replacing the
   * folder's previous ones), progress in a notification. Resolves when it ends.
   */
  async run(
    folder: vscode.WorkspaceFolder,
    def: FwaiTaskDefinition,
    print: (line: string) => void,
    onCancel: (cancel: () => void) => void = () => {},
  ): Promise<{ ok: boolean; runId: string; diagnostics: Diagnostic[] }> {
    const root = folder.uri.fsPath;
    let approved = def.approveFlash;
    const info = (this.cache.get(root) ?? []).find((s) => s.name === def.skill);
    if (info?.flashes && approved === undefined) {
      approved =
        (await vscode.window.showWarningMessage(
          `The skill '${def.skill}' flashes a board. Approve the flash?`,
          { modal: true },
          'Approve',
        )) === 'Approve';
    }
    const client = await this.conn.get();
    return vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `fwai: ${def.skill}`, cancellable: true },
      async (progress, token) => {
        const cancels: (() => void)[] = [];
        const signal = { onCancel: (cb: () => void) => cancels.push(cb) };
        token.onCancellationRequested(() => cancels.forEach((c) => c()));
        onCancel(() => cancels.forEach((c) => c()));
        print(`\x1b[1mfwai run ${def.skill}\x1b[0m in ${root}`);
        const r = await runSkill(
          client,
          { projectRoot: root, skill: def.skill, vars: def.vars, approved, board: def.board },
          (ev: SkillEvent) => {
            switch (ev.kind) {
              case 'step_started':
                progress.report({ message: ev.step });
                print(`\x1b[36m▶ ${ev.step}\x1b[0m${ev.text ? ` ${ev.text}` : ''}`);
                break;
              case 'output':
                print(ev.text);
                break;
              case 'diagnostic':
                print(`\x1b[${ev.ok ? 33 : 31}m${ev.text}\x1b[0m`);
                break;
              case 'step_finished':
                print(ev.ok ? `\x1b[32m✓ ${ev.step}\x1b[0m ${ev.text}` : `\x1b[31m✗ ${ev.step}\x1b[0m ${ev.text}`);
                break;
              case 'step_retry':
              case 'step_skipped':
                print(`\x1b[2m${ev.kind.replace('_', ' ')} ${ev.step} ${ev.text}\x1b[0m`);
                break;
              case 'run_finished':
                print(ev.ok ? `\x1b[32m${ev.text || 'run ok'}\x1b[0m` : `\x1b[31m${ev.text || 'run failed'}\x1b[0m`);
                break;
            }
          },
          signal,
        );
        if (r.error) print(`\x1b[31m${shown(r.error)}\x1b[0m`);
        this.publish(root, def.skill, r.diagnostics);
        const outcome = { ok: r.ok && !r.error, runId: r.runId, diagnostics: r.diagnostics };
        this.lastRun.set(`${root}\0${def.skill}`, outcome);
        this.changed.fire(undefined);
        if (!outcome.ok) {
          const errs = r.diagnostics.filter((d) => d.severity === 'error').length;
          void vscode.window.showErrorMessage(
            `fwai: ${def.skill} failed${errs ? ` with ${errs} error${errs > 1 ? 's' : ''} (see Problems)` : ''}${r.error ? `: ${shown(r.error)}` : ''}`,
          );
        }
        return outcome;
      },
    );
  }

  /** Typed diagnostics into Problems, by file, relative paths from the project root. */
  publish(root: string, skill: string, diags: Diagnostic[]): void {
    // Clear this project's earlier ones.
    const stale: vscode.Uri[] = [];
    this.diagnostics.forEach((uri) => {
      if (uri.fsPath.startsWith(root + path.sep)) stale.push(uri);
    });
    for (const uri of stale) this.diagnostics.delete(uri);
    const byFile = new Map<string, vscode.Diagnostic[]>();
    for (const d of diags) {
      const file = d.file ? path.resolve(root, d.file) : path.join(root, '.fwai', 'project.yaml');
      const line = Math.max(0, d.line - 1);
      const col = Math.max(0, d.column - 1);
      const v = new vscode.Diagnostic(
        new vscode.Range(line, col, line, d.column ? col + 1 : Number.MAX_SAFE_INTEGER),
        d.message,
        d.severity === 'error'
          ? vscode.DiagnosticSeverity.Error
          : d.severity === 'warning'
            ? vscode.DiagnosticSeverity.Warning
            : vscode.DiagnosticSeverity.Information,
      );
      v.source = `fwai ${skill}`;
      v.code = d.step ? `${d.step}${d.kind ? `: ${d.kind}` : ''}` : d.kind || undefined;
      const list = byFile.get(file) ?? [];
      list.push(v);
      byFile.set(file, list);
    }
    for (const [file, list] of byFile) this.diagnostics.set(vscode.Uri.file(file), list);
  }

  dispose(): void {
    for (const d of this.disposables) d.dispose();
  }
}
