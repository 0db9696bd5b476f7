// Register truth in Problems: each folder's C/C++ register code checked
// against its device's SVD by fwaid (Firmware.CheckRegisters), on demand
// (fwai: Check Registers) and on every save of a C/C++ file
// (fwai.checkRegistersOnSave). A folder whose device fwai does not know is
// said once on demand and left alone on save.
import * as path from 'path';
import * as vscode from 'vscode';
import { RegisterReport, checkRegisters } from '../client';
import { Connection } from './connection';

const C_FILES = new Set(['c', 'cpp']);

export class Registers implements vscode.Disposable {
  readonly diagnostics = vscode.languages.createDiagnosticCollection('fwai-registers');
  /** The last report per folder (for tests and the status). */
  readonly last = new Map<string, RegisterReport>();
  private readonly disposables: vscode.Disposable[] = [this.diagnostics];

  constructor(private readonly conn: Connection) {
    this.disposables.push(
      vscode.workspace.onDidSaveTextDocument((doc) => {
        if (!C_FILES.has(doc.languageId) && !/\.(c|h|cc|cpp|hpp)$/i.test(doc.fileName)) return;
        if (!vscode.workspace.getConfiguration('fwai').get<boolean>('checkRegistersOnSave', true)) return;
        const folder = vscode.workspace.getWorkspaceFolder(doc.uri);
        if (folder) void this.check(folder.uri.fsPath, { quiet: true }).catch(() => undefined);
      }),
    );
  }

  /** Checks `root`, replaces its findings in Problems, and returns the report. */
  async check(root: string, opts: { quiet?: boolean } = {}): Promise<RegisterReport | undefined> {
    let report: RegisterReport;
    try {
      report = await checkRegisters(await this.conn.get(), root);
    } catch (e) {
      if (opts.quiet) return undefined;
      throw e;
    }
    this.last.set(root, report);
    this.publish(root, report);
    return report;
  }

  private publish(root: string, report: RegisterReport): void {
    const stale: vscode.Uri[] = [];
    this.diagnostics.forEach((uri) => {
      if (uri.fsPath.startsWith(root + path.sep)) stale.push(uri);
    });
    for (const uri of stale) this.diagnostics.delete(uri);
    const byFile = new Map<string, vscode.Diagnostic[]>();
    for (const f of report.findings) {
      const file = path.resolve(root, f.file);
      const line = Math.max(0, f.line - 1);
      const col = Math.max(0, f.column - 1);
      const d = new vscode.Diagnostic(
        new vscode.Range(line, col, line, Number.MAX_SAFE_INTEGER),
        `${f.symbol}: ${f.code_says}; the SVD: ${f.svd_says}. Fix: ${f.fix}`,
        f.severity === 'error' ? vscode.DiagnosticSeverity.Error : vscode.DiagnosticSeverity.Warning,
      );
      d.source = `fwai registers (${report.checked.svd})`;
      d.code = f.kind;
      const list = byFile.get(file) ?? [];
      list.push(d);
      byFile.set(file, list);
    }
    for (const [file, list] of byFile) this.diagnostics.set(vscode.Uri.file(file), list);
  }

  dispose(): void {
    for (const d of this.disposables) d.dispose();
  }
}
