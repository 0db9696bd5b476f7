// Status bar: daemon state, the current session with its mode and cost, and
// the board lease this window holds.
import * as vscode from 'vscode';
import { formatCost } from '../client';
import { Boards } from './boards';
import type { Chat } from './chat';
import { Connection } from './connection';

export class StatusBar implements vscode.Disposable {
  private readonly daemon = vscode.window.createStatusBarItem('fwai.daemon', vscode.StatusBarAlignment.Left, 50);
  private readonly session = vscode.window.createStatusBarItem('fwai.session', vscode.StatusBarAlignment.Left, 49);
  private readonly lease = vscode.window.createStatusBarItem('fwai.lease', vscode.StatusBarAlignment.Left, 48);
  private readonly timer: NodeJS.Timeout;
  private disposables: vscode.Disposable[] = [];

  constructor(
    private readonly conn: Connection,
    private readonly chat: Chat,
    private readonly boards: Boards,
  ) {
    this.daemon.name = 'fwai daemon';
    this.session.name = 'fwai session';
    this.lease.name = 'fwai board lease';
    this.daemon.command = 'fwai.showLog';
    this.session.command = 'fwai.openChat';
    this.lease.command = 'fwai.boards.focus';
    this.disposables.push(
      conn.onDidChange(() => this.update()),
      chat.onDidChange(() => this.update()),
      boards.onDidChangeTreeData(() => this.update()),
    );
    this.timer = setInterval(() => this.update(), 10000);
    this.update();
    this.daemon.show();
  }

  update(): void {
    const c = this.conn;
    const icon = {
      connected: '$(plug)',
      connecting: '$(sync~spin)',
      disconnected: '$(debug-disconnect)',
      error: '$(error)',
    }[c.state];
    this.daemon.text = `${icon} fwai`;
    this.daemon.tooltip = `fwaid: ${c.state}${c.detail ? ` — ${c.detail}` : ''}\n${c.address}`;
    this.daemon.backgroundColor =
      c.state === 'error' ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
    const s = this.chat.session;
    if (s) {
      const st = this.chat.streamState;
      const mode = this.chat.model.mode || s.mode;
      const running = this.chat.model.running ? '$(pulse) ' : '';
      this.session.text = `${running}$(comment-discussion) ${truncate(s.title || s.id, 24)} · ${mode} · ${formatCost(this.chat.model.usage.cost_usd)}`;
      this.session.tooltip = `${s.id} (${mode} mode) in ${s.project_root}\nstream: ${st}\n${this.chat.model.usage.input_tokens} input / ${this.chat.model.usage.output_tokens} output tokens`;
      this.session.show();
    } else {
      this.session.hide();
    }
    const held = [...this.boards.devices].filter((d) => this.boards.heldByMe(d.id));
    if (held.length) {
      this.lease.text = `$(circuit-board) ${held
        .map((d) => {
          const l = this.boards.heldByMe(d.id)!;
          const m = Math.max(0, Math.round((l.expires_us / 1000 - Date.now()) / 60000));
          return `${d.id} ${m}m`;
        })
        .join(', ')}`;
      this.lease.tooltip = 'Board leases you hold (renewed while VS Code holds them)';
      this.lease.show();
    } else {
      this.lease.hide();
    }
  }

  dispose(): void {
    clearInterval(this.timer);
    for (const d of [this.daemon, this.session, this.lease, ...this.disposables]) d.dispose();
  }
}

function truncate(s: string, n: number): string {
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}
