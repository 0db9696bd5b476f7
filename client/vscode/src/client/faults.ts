// Fault captures: decoded offline by the fwai CLI (`fwai --json fault decode`),
// kept in a project's .fwai/captures, and made into a report for people.
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

/** A decoded capture as `fwai --json fault decode` prints it. */
export interface DecodedFault {
  board: string;
  image: { path: string; sha256: string };
  fault: {
    summary?: string;
    causes?: string[];
    cfsr?: string;
    hfsr?: string;
    mmfar?: string;
    bfar?: string;
    in_fault?: boolean;
  };
  frames: Array<{
    level: string;
    func: string;
    file?: string;
    line?: string;
    addr?: string;
    locals?: Array<{ name: string; value: string; arg?: boolean }>;
  }>;
  serial_before?: Array<{ seq?: number; text: string }>;
}

/** Decodes `file` with the fwai CLI `cli` (and `image` when given); rejects with the CLI's own words. */
export function decodeCapture(cli: string, file: string, image?: string): Promise<DecodedFault> {
  const args = ['--json', 'fault', 'decode', file, ...(image ? ['--image', image] : [])];
  return new Promise((resolve, reject) => {
    execFile(cli, args, { cwd: path.dirname(file), maxBuffer: 16 << 20, timeout: 60000 }, (err, stdout, stderr) => {
      if (err) {
        const said = String(stderr)
          .trim()
          .replace(/^fwai: /, '');
        reject(new Error(said || `${cli} fault decode: ${err.message}`));
        return;
      }
      try {
        resolve(JSON.parse(String(stdout).trim().split('\n').pop() ?? '') as DecodedFault);
      } catch {
        reject(new Error(`${cli} fault decode printed no report`));
      }
    });
  });
}

/** The report of a decoded capture, as Markdown. */
export function captureReport(d: DecodedFault, file: string): string {
  const f = d.fault ?? {};
  const out = [`# Fault on ${d.board}`, '', `**${f.summary ?? 'no fault decoded'}**`, ''];
  if (f.in_fault) {
    out.push(`CFSR \`${f.cfsr}\` · HFSR \`${f.hfsr}\` · MMFAR \`${f.mmfar}\` · BFAR \`${f.bfar}\``, '');
    for (const c of f.causes ?? []) out.push(`- ${c}`);
    out.push('');
  }
  out.push('## Backtrace', '');
  for (const fr of d.frames ?? []) {
    const where = fr.file ? ` at \`${fr.file}:${fr.line}\`` : '';
    out.push(`${fr.level}. **${fr.func}**${where}`);
    for (const v of fr.locals ?? []) out.push(`    - ${v.arg ? 'arg ' : ''}\`${v.name}\` = \`${v.value}\``);
  }
  const serial = d.serial_before ?? [];
  if (serial.length) {
    out.push('', '## Serial before the fault', '', '```');
    for (const l of serial) out.push(l.text);
    out.push('```');
  }
  out.push('', `Capture \`${file}\` · image \`${d.image?.path}\` (sha256 \`${d.image?.sha256}\`)`, '');
  return out.join('\n');
}

/** Saves a capture into `root`/.fwai/captures (owner-only); its path. */
export function saveCapture(root: string, board: string, capture: unknown): string {
  const dir = path.join(root, '.fwai', 'captures');
  fs.mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[-:]/g, '').replace(/\..*$/, '').replace('T', '-');
  const file = path.join(dir, `${board}-${stamp}.fwcap`);
  fs.writeFileSync(file, JSON.stringify(capture), { mode: 0o600 });
  return file;
}
