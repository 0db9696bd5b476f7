// The agent's file changes as diffs in VS Code's diff editor: the file before
// the call (edit_file: its replacement undone on the current text;
// write_file: the git HEAD version, or empty for a new file) against the file
// as it is now.
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as vscode from 'vscode';
import { FileChange, fileChangeOf, textBeforeEdit } from '../client';
import type { Chat } from './chat';

export const BEFORE_SCHEME = 'fwai-before';

export class Edits implements vscode.TextDocumentContentProvider, vscode.Disposable {
  private readonly contents = new Map<string, string>();
  private n = 0;
  private readonly reg: vscode.Disposable;

  constructor() {
    this.reg = vscode.workspace.registerTextDocumentContentProvider(BEFORE_SCHEME, this);
  }

  provideTextDocumentContent(uri: vscode.Uri): string {
    return this.contents.get(uri.query) ?? '';
  }

  /** The changes of a turn (default: the last one), in order. */
  changesOf(chat: Chat, turnId?: string): FileChange[] {
    const turn = turnId ? chat.model.turnById.get(turnId) : chat.model.turns[chat.model.turns.length - 1];
    if (!turn) return [];
    const out: FileChange[] = [];
    for (const node of chat.model.calls.values()) {
      if (node.turnId !== turn.id || node.status !== 'ok') continue;
      const c = fileChangeOf(node.tool, node.input, node.result, node.callId);
      if (c) out.push(c);
    }
    return out;
  }

  async showDiff(chat: Chat, callId: string): Promise<void> {
    const node = chat.model.calls.get(callId);
    if (!node) throw new Error(`tool call ${callId} is not in this session`);
    const change = fileChangeOf(node.tool, node.input, node.result, node.callId, node.status === 'error');
    if (!change)
      throw new Error(`${node.tool} ${callId} changed no file${node.status === 'error' ? ' (it failed)' : ''}`);
    const root = chat.projectRoot();
    if (!root) throw new Error('no project root for this session');
    await this.open(root, change, `${change.tool} by ${node.agent}`, chat.codeColumn());
  }

  async open(root: string, change: FileChange, label: string, viewColumn?: vscode.ViewColumn): Promise<void> {
    const abs = path.resolve(root, change.path);
    const current = fs.existsSync(abs) ? fs.readFileSync(abs, 'utf8') : '';
    let before: string | null = null;
    let note = '';
    if (change.tool === 'edit_file') {
      before = textBeforeEdit(change, current);
      if (before === null) note = ' (changed again since; against git HEAD)';
    }
    if (before === null) {
      if (change.created) before = '';
      else {
        before = await gitShow(root, change.path);
        if (before === null) {
          before = '';
          note = ' (no earlier version known)';
        } else if (!note) note = ' (against git HEAD)';
      }
    }
    const key = String(++this.n);
    this.contents.set(key, before);
    const left = vscode.Uri.from({ scheme: BEFORE_SCHEME, path: `/${change.path}`, query: key });
    await vscode.commands.executeCommand('vscode.diff', left, vscode.Uri.file(abs), `${change.path}: ${label}${note}`, {
      preview: true,
      viewColumn,
    });
  }

  dispose(): void {
    this.reg.dispose();
  }
}

function gitShow(root: string, rel: string): Promise<string | null> {
  return new Promise((resolve) => {
    execFile('git', ['-C', root, 'show', `HEAD:./${rel}`], { maxBuffer: 32 << 20 }, (err, stdout) =>
      resolve(err ? null : stdout),
    );
  });
}
