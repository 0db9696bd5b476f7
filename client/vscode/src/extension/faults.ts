// Fault captures in VS Code: any capture opened as a report, decoded offline
// by the fwai CLI as on the command line.
import * as vscode from 'vscode';
import * as path from 'node:path';
import { DecodedFault, captureReport, decodeCapture } from '../client';

/** The fwai CLI: fwai.cliPath, else `fwai` beside fwai.fwaidPath, else on PATH. */
export function cliPath(): string {
  const c = vscode.workspace.getConfiguration('fwai');
  const cli = c.get<string>('cliPath', '');
  if (cli) return cli;
  const fwaid = c.get<string>('fwaidPath', '');
  return fwaid ? path.join(path.dirname(fwaid), 'fwai') : 'fwai';
}

/**
 * Opens `file` (asked for when not given) as a report. A capture whose image
 * is not found offers to choose it.
 */
export async function openCaptureReport(file?: string): Promise<vscode.TextDocument | undefined> {
  if (!file) {
    const picked = await vscode.window.showOpenDialog({
      canSelectMany: false,
      filters: { 'Fault captures': ['fwcap', 'json'] },
      openLabel: 'Open Capture',
    });
    file = picked?.[0]?.fsPath;
    if (!file) return undefined;
  }
  let decoded: DecodedFault;
  try {
    decoded = await decodeCapture(cliPath(), file);
  } catch (e) {
    const msg = e instanceof Error ? e.message : String(e);
    if (!/needs the image with sha256/.test(msg)) throw e;
    const choice = await vscode.window.showWarningMessage(msg, 'Choose Image…');
    if (choice !== 'Choose Image…') return undefined;
    const elf = await vscode.window.showOpenDialog({ canSelectMany: false, filters: { ELF: ['elf'] } });
    if (!elf?.[0]) return undefined;
    decoded = await decodeCapture(cliPath(), file, elf[0].fsPath);
  }
  const doc = await vscode.workspace.openTextDocument({ language: 'markdown', content: captureReport(decoded, file) });
  await vscode.window.showTextDocument(doc, { preview: false });
  return doc;
}
