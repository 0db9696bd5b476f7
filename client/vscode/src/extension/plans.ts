// A submitted plan: opened as a markdown editor (the session's plan file), and
// decided from the editor's title bar, the chat, or the command palette.
// Approve sends the editor's text when it differs from what was submitted, so
// the edited text is what gets approved.
import * as path from 'node:path';
import * as vscode from 'vscode';
import { roleAllows } from '../client/model';
import type { Chat } from './chat';

export class Plans implements vscode.Disposable {
  private opened = '';
  private disposables: vscode.Disposable[] = [];

  constructor(private readonly chat: Chat) {
    this.disposables.push(
      chat.onDidChange(() => void this.sync()),
      vscode.commands.registerCommand('fwai.openPlan', () => this.openEditor()),
      vscode.commands.registerCommand('fwai.approvePlan', () => this.approve()),
      vscode.commands.registerCommand('fwai.redirectPlan', (feedback?: string) => this.redirect(feedback)),
    );
  }

  private planUri(): vscode.Uri | null {
    const p = this.chat.model.plan;
    const root = this.chat.projectRoot();
    if (!p || !root) return null;
    return vscode.Uri.file(path.resolve(root, p.path));
  }

  private async sync(): Promise<void> {
    const p = this.chat.model.plan;
    const uri = this.planUri();
    await vscode.commands.executeCommand('setContext', 'fwai.planPending', !!p);
    await vscode.commands.executeCommand('setContext', 'fwai.planPaths', uri ? [uri.fsPath] : []);
    await vscode.commands.executeCommand('setContext', 'fwai.turnRunning', this.chat.model.running);
    // A session shared with the caller to watch or answer: the plan is its
    // owner's (or an approver's) to decide, nothing to open or announce here.
    if (p && this.opened !== p.planId && roleAllows(this.chat.session, 'approve')) {
      this.opened = p.planId;
      await this.openEditor();
      this.announce(p.planId);
    }
  }

  /**
   * Says a plan waits, for as long as it waits: the notification closes itself
   * once the plan is decided (here, in the chat, or by another client) or
   * another session is opened, so nothing stale is left to click.
   */
  private announce(planId: string): void {
    void vscode.window.withProgress(
      {
        location: vscode.ProgressLocation.Notification,
        title: 'fwai: the agent submitted a plan',
        cancellable: false,
      },
      (progress) => {
        progress.report({ message: 'Edit it in the editor, then Approve or Redirect from its title bar or the chat.' });
        return new Promise<void>((resolve) => {
          const sub = this.chat.onDidChange(() => {
            if (this.chat.model.plan?.planId === planId) return;
            sub.dispose();
            resolve();
          });
          this.disposables.push(sub);
        });
      },
    );
  }

  async openEditor(): Promise<void> {
    const uri = this.planUri();
    if (!uri) throw new Error('no plan is waiting for a decision');
    const doc = await vscode.workspace.openTextDocument(uri);
    await vscode.window.showTextDocument(doc, { preview: false, viewColumn: this.chat.codeColumn() });
  }

  /** Refuses, saying why, when the caller's share of the session does not reach deciding plans. */
  private mayDecide(): boolean {
    if (roleAllows(this.chat.session, 'approve')) return true;
    const s = this.chat.session;
    void vscode.window.showWarningMessage(
      `fwai: ${s?.owner_user}'s session is shared with you to ${s?.my_role}: deciding its plan needs the role approve`,
    );
    return false;
  }

  async approve(): Promise<void> {
    if (!this.mayDecide()) return;
    const p = this.chat.model.plan;
    const uri = this.planUri();
    if (!p || !uri || !this.chat.stream) {
      void vscode.window.showWarningMessage('fwai: no plan is waiting for a decision');
      return;
    }
    const doc = vscode.workspace.textDocuments.find((d) => d.uri.fsPath === uri.fsPath);
    let edited = '';
    if (doc) {
      const text = doc.getText();
      if (text !== p.text) edited = text;
      // The daemon writes the approved text to the same file: save first so
      // the editor does not hold a conflicting unsaved copy.
      if (doc.isDirty) await doc.save();
    }
    this.chat.stream.decidePlan(p.planId, { approve: true, editedPlan: edited });
    void vscode.window.setStatusBarMessage(edited ? 'fwai: plan approved as edited' : 'fwai: plan approved', 4000);
  }

  async redirect(feedback?: string): Promise<void> {
    if (!this.mayDecide()) return;
    const p = this.chat.model.plan;
    if (!p || !this.chat.stream) {
      void vscode.window.showWarningMessage('fwai: no plan is waiting for a decision');
      return;
    }
    const text =
      typeof feedback === 'string'
        ? feedback
        : await vscode.window.showInputBox({
            prompt: 'What should the plan do differently? (the agent stays in plan mode)',
            ignoreFocusOut: true,
          });
    if (!text) return;
    this.chat.stream.decidePlan(p.planId, { approve: false, feedback: text });
  }

  dispose(): void {
    for (const d of this.disposables) d.dispose();
  }
}
