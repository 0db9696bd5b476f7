// Evidence: the log's runs and turns with the verify status, a record opened
// as JSON, SARIF exported into Problems, the HTML report in a webview.
import * as path from 'node:path';
import * as vscode from 'vscode';
import {
  EvidenceRun,
  EvidenceVerification,
  exportEvidence,
  getEvidenceRun,
  listEvidenceRuns,
  sarifDiagnostics,
  verifyEvidence,
} from '../client';
import { Connection, shown, staleAfter } from './connection';

type Node = { kind: 'status' } | { kind: 'run'; run: EvidenceRun; rec: any };

export class Evidence implements vscode.TreeDataProvider<Node>, vscode.Disposable {
  private readonly changed = new vscode.EventEmitter<Node | undefined>();
  readonly onDidChangeTreeData = this.changed.event;
  runs: EvidenceRun[] = [];
  verify: EvidenceVerification | null = null;
  private error = '';
  readonly diagnostics = vscode.languages.createDiagnosticCollection('fwai-evidence');

  private readonly disposables: vscode.Disposable[] = [];

  constructor(private readonly conn: Connection) {
    // Another daemon or other credentials: the records listed were the old connection's.
    this.disposables.push(
      conn.onDidReset(() => {
        this.forget();
        void this.refresh();
      }),
    );
  }

  async refresh(): Promise<void> {
    try {
      const client = await this.conn.get();
      this.runs = await listEvidenceRuns(client, 200);
      this.error = '';
    } catch (e) {
      this.error = shown(e);
      if (staleAfter(e)) this.forget();
    }
    this.changed.fire(undefined);
  }

  /** Why the log could not be read, with what to do; '' when it was. The view shows it above the list, wrapped. */
  get message(): string {
    return this.error;
  }

  private forget(): void {
    this.runs = [];
    this.verify = null;
  }

  async verifyLog(): Promise<void> {
    const client = await this.conn.get();
    const v = await verifyEvidence(client);
    this.verify = v;
    this.changed.fire(undefined);
    if (v.ok) void vscode.window.showInformationMessage(`fwai: evidence log verified (${v.records} records)`);
    else
      void vscode.window.showErrorMessage(
        `fwai: evidence log does NOT verify: first bad record ${v.first_bad}: ${v.detail}`,
      );
  }

  getChildren(n?: Node): Node[] {
    if (n) return [];
    return [
      { kind: 'status' },
      ...this.runs.map((run) => ({ kind: 'run' as const, run, rec: safeParse(run.record_json) })),
    ];
  }

  getTreeItem(n: Node): vscode.TreeItem {
    if (n.kind === 'status') {
      const v = this.verify;
      const records = (n: number) => `${n} record${n === 1 ? '' : 's'}`;
      const it = new vscode.TreeItem(
        v
          ? v.ok
            ? `Verified: ${records(v.records)}`
            : `NOT verified: ${v.first_bad}`
          : `${records(this.runs.length)} (not verified yet)`,
      );
      it.iconPath = new vscode.ThemeIcon(v ? (v.ok ? 'verified-filled' : 'error') : 'shield');
      it.tooltip =
        v?.detail || "Verify recomputes the hash chain, every signed checkpoint and every record's inclusion proof";
      it.command = { command: 'fwai.verifyEvidence', title: 'Verify' };
      return it;
    }
    const j = n.rec ?? {};
    const kind = String(j.kind ?? '?');
    let label = kind;
    let desc = '';
    let icon = 'note';
    if (kind === 'agent_turn') {
      label = `turn ${j.session_id ?? ''}`;
      desc = `${j.model ?? ''} · ${(j.tools ?? []).length} tool calls · ${j.stop_reason ?? ''}`;
      icon = 'comment-discussion';
    } else if (kind === 'skill_run') {
      label = `${j.skill} ${j.ok ? '✓' : '✗'}`;
      desc = `${j.failure_class && !j.ok ? `${j.failure_class} · ` : ''}${j.diagnostics?.errors ?? 0} errors · ${path.basename(String(j.project ?? ''))}`;
      icon = j.ok ? 'pass' : 'error';
    } else if (kind === 'flash') {
      label = `flash ${j.board ?? ''}`;
      desc = `${String(j.image_sha256 ?? '').slice(0, 12)}${j.booted ? ' · booted' : ''}`;
      icon = 'zap';
    }
    const it = new vscode.TreeItem(label);
    it.description = `#${n.run.index} ${desc}`;
    it.tooltip = `${n.run.run_id}\nleaf ${n.run.hash}`;
    it.iconPath = new vscode.ThemeIcon(icon);
    it.command = { command: 'fwai.openEvidence', title: 'Open', arguments: [n.run.run_id] };
    it.contextValue = 'evidence-run';
    return it;
  }

  async open(runId: string): Promise<vscode.TextDocument> {
    const client = await this.conn.get();
    const r = await getEvidenceRun(client, runId);
    const content = JSON.stringify(
      { run_id: r.run_id, index: r.index, leaf_hash: r.hash, record: safeParse(r.record_json) },
      null,
      2,
    );
    const doc = await vscode.workspace.openTextDocument({ language: 'json', content });
    await vscode.window.showTextDocument(doc, { preview: true });
    return doc;
  }

  /** SARIF of the log; the latest skill run of each project into Problems. */
  async exportSarif(): Promise<number> {
    const client = await this.conn.get();
    const { data } = await exportEvidence(client, 'sarif');
    const doc = JSON.parse(data.toString('utf8'));
    const diags = sarifDiagnostics(doc);
    this.diagnostics.clear();
    const byFile = new Map<string, vscode.Diagnostic[]>();
    for (const d of diags) {
      if (!d.file) continue;
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
      v.source = `fwai evidence ${d.run}`;
      v.code = d.rule;
      byFile.set(d.file, [...(byFile.get(d.file) ?? []), v]);
    }
    for (const [f, list] of byFile) this.diagnostics.set(vscode.Uri.file(f), list);
    void vscode.window.showInformationMessage(`fwai: ${diags.length} findings from the evidence log in Problems`);
    return diags.length;
  }

  async showHtml(): Promise<vscode.WebviewPanel> {
    const client = await this.conn.get();
    const { data } = await exportEvidence(client, 'html');
    const panel = vscode.window.createWebviewPanel(
      'fwai.evidenceReport',
      'fwai evidence report',
      vscode.ViewColumn.Active,
      { enableScripts: false },
    );
    // The report is the daemon's own static HTML; scripts stay off.
    panel.webview.html = data
      .toString('utf8')
      .replace(
        '<head>',
        `<head><meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:;">`,
      );
    return panel;
  }

  dispose(): void {
    this.diagnostics.dispose();
    for (const d of this.disposables) d.dispose();
  }
}

function safeParse(s: string): any {
  try {
    return JSON.parse(s);
  } catch {
    return null;
  }
}
