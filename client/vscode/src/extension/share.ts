// Share and Unshare: the owner of a session lets another user watch, answer,
// approve or drive it (fwaid checks each call against the share), or ends
// that. The prompts only gather what Sessions.Share needs; fwaid resolves the
// user to a verified identity and says clearly when it cannot.
import * as vscode from 'vscode';
import { SHARE_ROLES, SessionInfo, ShareRole } from '../client';
import { SessionsView, isShared, shareLine } from './sessionsView';

const ROLE_DETAIL: Record<ShareRole, string> = {
  watch: 'the live stream, the history and the evidence of this session',
  answer: "also answer the agent's questions",
  approve: 'also approve or send back plans and edits waiting for approval',
  drive: 'also send messages, cancel a turn and switch mode',
};

const EXPIRIES = [
  { label: 'Until unshared', seconds: 0 },
  { label: '1 hour', seconds: 3600 },
  { label: '8 hours', seconds: 8 * 3600 },
  { label: '1 day', seconds: 24 * 3600 },
];

function owned(s: SessionInfo | null | undefined, what: string): SessionInfo {
  if (!s) throw new Error(`open a session first, or pick one in Sessions: ${what}`);
  if (isShared(s)) throw new Error(`${s.owner_user} owns session ${s.id}: only its owner can ${what}`);
  return s;
}

export async function shareCommand(view: SessionsView, s: SessionInfo | null | undefined): Promise<void> {
  const session = owned(s, 'share it');
  const user = (
    await vscode.window.showInputBox({
      title: `Share "${session.title || session.id}"`,
      prompt: 'A user fwaid knows: a configured user, a local account, a token user, or role:NAME',
      placeHolder: 'bob',
      validateInput: (v) => (v.trim() ? undefined : 'name the user to share with'),
    })
  )?.trim();
  if (!user) return;
  const role = await vscode.window.showQuickPick(
    SHARE_ROLES.map((r) => ({ label: r, detail: ROLE_DETAIL[r] })),
    { title: `What ${user} may do in this session`, placeHolder: 'Role' },
  );
  if (!role) return;
  const expiry = await vscode.window.showQuickPick(EXPIRIES, { title: 'For how long', placeHolder: 'Expires' });
  if (!expiry) return;
  const made = await view.share(session.id, user, role.label as ShareRole, expiry.seconds);
  void vscode.window.showInformationMessage(
    `Session "${session.title || session.id}" shared with ${shareLine(made)}. Tools still run as you; ${user} asks the agent, within the role.`,
  );
}

export async function unshareCommand(view: SessionsView, s: SessionInfo | null | undefined): Promise<void> {
  const session = owned(s, 'unshare it');
  const shares = view.sessions.find((x) => x.id === session.id)?.shares ?? session.shares ?? [];
  if (!shares.length) throw new Error(`session ${session.id} is shared with nobody`);
  const pick = await vscode.window.showQuickPick(
    shares.map((sh) => ({ label: sh.user, description: shareLine(sh), user: sh.user })),
    { title: `Stop sharing "${session.title || session.id}" with`, placeHolder: 'User' },
  );
  if (!pick) return;
  await view.unshare(session.id, pick.user);
  void vscode.window.showInformationMessage(
    `Session "${session.title || session.id}" is no longer shared with ${pick.user}.`,
  );
}
