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

  /**
   * An edit waiting for the user's accept, as a diff: the file now ↔ the file
   * as the call would leave it (its input applied to the current text).
   */
  async showProposed(chat: Chat, callId: string): Promise<void> {
    const node = chat.model.calls.get(callId);
    if (!node) throw new Error(`tool call ${callId} is not in this session`);
    const root = chat.projectRoot();
    if (!root) throw new Error('no project root for this session');
    let input: any = {};
    try {
      input = JSON.parse(node.input || '{}');
    } catch {
      throw new Error(`${node.tool} ${callId}: its input is not JSON`);
    }
    const rel = String(input.path ?? '');
    const abs = path.resolve(root, rel);
    const current = fs.existsSync(abs) ? fs.readFileSync(abs, 'utf8') : '';
    let proposed: string;
    if (node.tool === 'write_file') proposed = String(input.content ?? '');
    else {
      const at = current.indexOf(String(input.old_string ?? ''));
      if (at < 0 || !input.old_string) throw new Error(`${rel}: the text edit_file would replace is not in the file`);
      proposed = current.slice(0, at) + String(input.new_string ?? '') + current.slice(at + input.old_string.length);
    }
    const key = String(++this.n);
    this.contents.set(key, proposed);
    const right = vscode.Uri.from({ scheme: BEFORE_SCHEME, path: `/${rel}`, query: key });
    const left = fs.existsSync(abs) ? vscode.Uri.file(abs) : right.with({ query: 'none' });
    await vscode.commands.executeCommand('vscode.diff', left, right, `${rel}: now ↔ proposed by ${node.agent}`, {
      preview: true,
      viewColumn: chat.codeColumn(),
    });
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
