// Datasheets: `fwai: Search Datasheets` (a quick pick over the knowledge
// base, opening the cited document at its page or lines) and adding files or
// folders from the explorer, with progress.
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as vscode from 'vscode';
import { SearchResult, expandPaths, ingestFile, search } from '../client';
import { Connection, shown } from './connection';

export const PASSAGE_SCHEME = 'fwai-kb';

export class Knowledge implements vscode.TextDocumentContentProvider, vscode.Disposable {
  private readonly passages = new Map<string, string>();
  private n = 0;
  private readonly reg: vscode.Disposable;

  constructor(
    private readonly conn: Connection,
    private readonly out: vscode.OutputChannel,
  ) {
    this.reg = vscode.workspace.registerTextDocumentContentProvider(PASSAGE_SCHEME, this);
  }

  provideTextDocumentContent(uri: vscode.Uri): string {
    return this.passages.get(uri.query) ?? '';
  }

  /** The quick pick: type a question, pick a passage, open it. */
  async searchCommand(initial?: string): Promise<SearchResult | undefined> {
    const client = await this.conn.get();
    const qp = vscode.window.createQuickPick<vscode.QuickPickItem & { r?: SearchResult }>();
    qp.placeholder = 'Search the datasheets (e.g. "which register enables the GPIOA clock")';
    qp.matchOnDescription = true;
    qp.matchOnDetail = true;
    qp.value = initial ?? '';
    let seq = 0;
    let timer: NodeJS.Timeout | null = null;
    const run = (q: string) => {
      const mine = ++seq;
      if (q.trim().length < 2) {
        qp.items = [];
        return;
      }
      qp.busy = true;
      search(client, q, { maxResults: 20 })
        .then((resp) => {
          if (mine !== seq) return;
          qp.items = resp.results.map((r) => ({
            label: `${path.basename(r.doc)}${r.page ? ` p.${r.page}` : r.start_line ? `:${r.start_line}` : ''}`,
            description: `${r.title_path}  ${r.score.toFixed(2)}`,
            detail: r.text.replace(/\s+/g, ' ').slice(0, 200),
            alwaysShow: true,
            r,
          }));
          if (!resp.results.length) qp.items = [{ label: 'No passage matches', alwaysShow: true }];
        })
        .catch((e) => {
          if (mine === seq) qp.items = [{ label: `Search failed: ${shown(e)}`, alwaysShow: true }];
        })
        .finally(() => {
          if (mine === seq) qp.busy = false;
        });
    };
    qp.onDidChangeValue((v) => {
      if (timer) clearTimeout(timer);
      timer = setTimeout(() => run(v), 150);
    });
    if (qp.value) run(qp.value);
    const picked = await new Promise<SearchResult | undefined>((resolve) => {
      qp.onDidAccept(() => {
        resolve(qp.selectedItems[0]?.r);
        qp.hide();
      });
      qp.onDidHide(() => resolve(undefined));
      qp.show();
    });
    qp.dispose();
    if (picked) await this.openResult(picked);
    return picked;
  }

  /**
   * Text documents open at the cited lines. For PDFs (and files not on this
   * machine) the cited passage opens as a read-only document headed by its
   * source and page, with the PDF itself opened next to it when it exists.
   */
  async openResult(r: SearchResult): Promise<void> {
    const isText = !/\.pdf$/i.test(r.doc) && fs.existsSync(r.doc);
    if (isText) {
      const line = Math.max(0, (r.start_line || 1) - 1);
      const end = Math.max(line, (r.end_line || r.start_line || 1) - 1);
      await vscode.window.showTextDocument(vscode.Uri.file(r.doc), {
        selection: new vscode.Range(line, 0, end, 0),
        preview: true,
      });
      return;
    }
    const key = String(++this.n);
    const where = r.page ? `page ${r.page}` : r.start_line ? `lines ${r.start_line}-${r.end_line}` : '';
    this.passages.set(
      key,
      `${r.doc}${where ? ` — ${where}` : ''}\n${r.title_path ? `${r.title_path}\n` : ''}\n${r.text}\n`,
    );
    const uri = vscode.Uri.from({
      scheme: PASSAGE_SCHEME,
      path: `/${path.basename(r.doc)}${r.page ? ` p${r.page}` : ''}.md`,
      query: key,
    });
    const doc = await vscode.workspace.openTextDocument(uri);
    await vscode.window.showTextDocument(doc, { preview: true });
    if (/\.pdf$/i.test(r.doc) && fs.existsSync(r.doc)) {
      // Browsers' and VS Code's PDF viewers take #page=N.
      void vscode.env.openExternal(vscode.Uri.file(r.doc).with({ fragment: r.page ? `page=${r.page}` : '' }));
    }
  }

  /** Adds the files (folders: every file under them) to the knowledge base. */
  async add(uris: vscode.Uri[]): Promise<{ added: number; unchanged: number; failed: string[] }> {
    const client = await this.conn.get();
    const files = expandPaths(uris.map((u) => u.fsPath));
    const result = { added: 0, unchanged: 0, failed: [] as string[] };
    await vscode.window.withProgress(
      {
        location: vscode.ProgressLocation.Notification,
        title: 'fwai: adding to the knowledge base',
        cancellable: true,
      },
      async (progress, token) => {
        for (let i = 0; i < files.length && !token.isCancellationRequested; i++) {
          const f = files[i];
          progress.report({ message: `${i + 1}/${files.length} ${path.basename(f)}`, increment: 100 / files.length });
          const r = await ingestFile(client, f, {}, (p) =>
            progress.report({ message: `${i + 1}/${files.length} ${path.basename(f)}: ${p.stage}` }),
          );
          if (!r.ok) {
            result.failed.push(r.error ?? f);
            this.out.appendLine(`kb add ${f}: ${r.error}`);
          } else if (r.last?.unchanged) result.unchanged++;
          else {
            result.added++;
            this.out.appendLine(
              `kb add ${f}: ${r.last?.chunks ?? 0} chunks${r.last?.pages ? `, ${r.last.pages} pages` : ''}`,
            );
          }
        }
      },
    );
    const msg = `fwai: added ${result.added}, unchanged ${result.unchanged}${result.failed.length ? `, failed ${result.failed.length}` : ''}`;
    if (result.failed.length) void vscode.window.showWarningMessage(`${msg}: ${result.failed[0]}`);
    else void vscode.window.showInformationMessage(msg);
    return result;
  }

  dispose(): void {
    this.reg.dispose();
  }
}
