// Boards: devices and boards with health, holder and lease expiry; lease,
// renew (kept renewed while VS Code holds it), release; flash the project's
// image (the daemon's flash guard decides and its refusal names the rule);
// serial terminals fed by the daemon's serial stream.
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as vscode from 'vscode';
import {
  Device,
  FlashProgress,
  Lease,
  SerialSession,
  StreamChoice,
  acquireLease,
  callerUid,
  configuredImage,
  daemonStatus,
  flashImage,
  getProjectConfig,
  listDevices,
  releaseLease,
  renewLease,
  streamChoices,
} from '../client';
import { Connection, shown, staleAfter } from './connection';
import { ago } from './sessionsView';

export type { Device, Lease } from '../client';

function left(us: number): string {
  const s = Math.round((us / 1000 - Date.now()) / 1000);
  if (s <= 0) return 'expired';
  return s < 120 ? `${s}s left` : `${Math.round(s / 60)}m left`;
}

export class Boards implements vscode.TreeDataProvider<Device>, vscode.Disposable {
  private readonly changed = new vscode.EventEmitter<Device | undefined>();
  readonly onDidChangeTreeData = this.changed.event;
  devices: Device[] = [];
  leases: Lease[] = [];
  /** Leases this window took (renewed while it runs). */
  readonly mine = new Map<string, Lease>();
  private myUid = '';
  private error = '';
  private timers: NodeJS.Timeout[] = [];
  readonly terminals = new Set<vscode.Terminal>();
  private disposables: vscode.Disposable[] = [];

  constructor(
    private readonly conn: Connection,
    private readonly out: vscode.OutputChannel,
  ) {
    this.timers.push(setInterval(() => void this.refresh(), 5000));
    this.timers.push(setInterval(() => void this.renewDue(), 5000));
    this.disposables.push(
      conn.onDidChange(() => conn.state === 'connected' && void this.refresh()),
      conn.onDidReset(() => {
        this.forget();
        void this.refresh();
      }),
    );
  }

  async refresh(): Promise<void> {
    try {
      const client = await this.conn.get();
      if (!this.myUid) this.myUid = callerUid(await daemonStatus(client));
      const r = await listDevices(client);
      this.devices = r.devices;
      this.leases = r.leases;
      this.error = '';
      this.conn.noteSuccess();
      for (const [dev, l] of this.mine) {
        if (!this.leases.some((x) => x.lease_id === l.lease_id)) this.mine.delete(dev);
      }
    } catch (e) {
      this.error = shown(e);
      this.conn.noteFailure(e);
      if (staleAfter(e)) this.forget();
    }
    this.changed.fire(undefined);
  }

  /** Drops what was listed: it may not be this user's (or this daemon's) any more. */
  private forget(): void {
    this.devices = [];
    this.leases = [];
    this.mine.clear();
    this.myUid = '';
  }

  /** The lease on `deviceId` held by this user (any of their programs), if any. */
  heldByMe(deviceId: string): Lease | undefined {
    const m = this.mine.get(deviceId);
    if (m) return m;
    // fwaid says which leases are the caller's (unix account or token); an
    // older fwaid only names the holder, with the uid.
    return this.leases.find(
      (l) =>
        l.device_id === deviceId &&
        (l.yours || (this.myUid !== '' && new RegExp(`\\(uid ${this.myUid}\\)`).test(l.holder))),
    );
  }

  getChildren(d?: Device): Device[] {
    if (d) return [];
    const order = (x: Device) => (x.kind === 'board' || x.kind === 'simulated' ? 0 : 1);
    const listed = [...this.devices].sort((a, b) => order(a) - order(b) || a.id.localeCompare(b.id));
    return listed;
  }

  /** Why the list could not be read, with what to do; '' when it was. The view shows it above the list, wrapped. */
  get message(): string {
    return this.error;
  }

  getTreeItem(d: Device): vscode.TreeItem {
    const it = new vscode.TreeItem(d.name && d.name !== d.id ? `${d.id}` : d.id);
    const board = d.kind === 'board' || d.kind === 'simulated';
    const mine = this.heldByMe(d.id);
    const parts = [d.health];
    if (d.holder) parts.push(mine ? `held by you (${left(d.lease_expires_us)})` : `held by ${d.holder}`);
    else if (board) parts.push('free');
    if (d.state && d.state !== 'running') parts.push(d.state);
    it.description = parts.join(' · ');
    it.tooltip = new vscode.MarkdownString(
      [
        `**${d.id}** (${d.kind}) ${d.name && d.name !== d.id ? `— ${d.name}` : ''}`,
        `health: ${d.health}${d.health_reason ? ` — ${d.health_reason}` : ''}`,
        d.target ? `target: ${d.target}` : '',
        d.holder
          ? `holder: ${d.holder}, since ${ago(d.held_since_us)}, lease until ${new Date(d.lease_expires_us / 1000).toLocaleTimeString()}`
          : '',
        d.image ? `image: ${d.image}` : '',
        d.path ? `port: ${d.path}` : '',
      ]
        .filter((x) => x)
        .join('\n\n'),
    );
    it.iconPath = new vscode.ThemeIcon(
      d.health === 'bad'
        ? 'error'
        : d.health === 'maintenance'
          ? 'tools'
          : d.health === 'quarantined'
            ? 'warning'
            : board
              ? 'circuit-board'
              : d.kind === 'probe'
                ? 'debug'
                : 'plug',
      d.health === 'bad'
        ? new vscode.ThemeColor('errorForeground')
        : d.health === 'quarantined'
          ? new vscode.ThemeColor('problemsWarningIcon.foreground')
          : mine
            ? new vscode.ThemeColor('charts.green')
            : undefined,
    );
    it.contextValue = board ? (mine ? 'board-mine' : d.holder ? 'board-held' : 'board-free') : 'device';
    return it;
  }

  private async pickBoard(
    d: Device | undefined,
    filter: (x: Device) => boolean,
    what: string,
  ): Promise<Device | undefined> {
    if (d?.id) return d;
    if (!this.devices.length) await this.refresh();
    const cands = this.devices.filter((x) => (x.kind === 'board' || x.kind === 'simulated') && filter(x));
    if (cands.length === 1) return cands[0];
    if (!cands.length) throw new Error(`no board to ${what}`);
    const pick = await vscode.window.showQuickPick(
      cands.map((x) => ({ label: x.id, description: `${x.health}${x.holder ? ` · held by ${x.holder}` : ''}`, d: x })),
      { placeHolder: `Board to ${what}` },
    );
    return pick?.d;
  }

  async lease(d?: Device): Promise<Lease | undefined> {
    const board = await this.pickBoard(d, (x) => !this.heldByMe(x.id), 'lease');
    if (!board) return;
    const ttl = vscode.workspace.getConfiguration('fwai').get<number>('leaseTtlSeconds', 600);
    const client = await this.conn.get();
    const l = await acquireLease(client, board.id, { ttlS: ttl });
    this.mine.set(board.id, l);
    this.out.appendLine(`leased ${board.id} (${l.lease_id}, ${ttl} s, renewed while VS Code holds it)`);
    await this.refresh();
    return l;
  }

  async renew(d?: Device): Promise<void> {
    const board = await this.pickBoard(d, (x) => !!this.heldByMe(x.id), 'renew');
    if (!board) return;
    const l = this.heldByMe(board.id);
    if (!l) throw new Error(`you do not hold ${board.id}`);
    const client = await this.conn.get();
    this.mine.set(board.id, await renewLease(client, l.lease_id));
    await this.refresh();
  }

  /** Renews this window's leases when a third of their TTL is left. */
  private async renewDue(): Promise<void> {
    if (!vscode.workspace.getConfiguration('fwai').get<boolean>('autoRenewLease', true)) return;
    const client = this.conn.peek();
    if (!client) return;
    for (const [dev, l] of this.mine) {
      const leftMs = l.expires_us / 1000 - Date.now();
      if (leftMs > (l.ttl_s * 1000) / 3) continue;
      try {
        this.mine.set(dev, await renewLease(client, l.lease_id));
      } catch (e) {
        this.out.appendLine(`renewing ${dev}: ${(e as Error).message}`);
        this.mine.delete(dev);
        void vscode.window.showWarningMessage(`fwai: lost the lease on ${dev}: ${shown(e)}`);
      }
    }
  }

  async release(d?: Device): Promise<void> {
    const board = await this.pickBoard(d, (x) => !!this.heldByMe(x.id), 'release');
    if (!board) return;
    const l = this.heldByMe(board.id);
    const client = await this.conn.get();
    await releaseLease(client, { leaseId: l?.lease_id, deviceId: board.id });
    this.mine.delete(board.id);
    await this.refresh();
  }

  /** The image to flash: fwai.image, else the project's image, else the only build/*.elf. */
  async imageFor(root: string): Promise<string> {
    const setting = vscode.workspace.getConfiguration('fwai', vscode.Uri.file(root)).get<string>('image');
    if (setting) return path.resolve(root, setting);
    try {
      const client = await this.conn.get();
      const image = configuredImage(await getProjectConfig(client, root));
      if (image) return path.resolve(root, image);
    } catch {
      // No project config: look for the build's ELF.
    }
    const dir = path.join(root, 'build');
    const elfs = fs.existsSync(dir) ? fs.readdirSync(dir).filter((f) => f.endsWith('.elf')) : [];
    if (elfs.length === 1) return path.join(dir, elfs[0]);
    throw new Error(
      elfs.length
        ? `several build/*.elf in ${root}; set fwai.image`
        : `no image: build the project first, or set fwai.image (looked in ${dir})`,
    );
  }

  async flash(d: Device | undefined, root: string, approved?: boolean): Promise<{ ok: boolean; message: string }> {
    const board = await this.pickBoard(d, (x) => !!this.heldByMe(x.id) || !x.holder, 'flash');
    if (!board) return { ok: false, message: 'no board' };
    const image = await this.imageFor(root);
    if (approved === undefined) {
      const pick = await vscode.window.showWarningMessage(
        `Flash ${path.relative(root, image)} to ${board.id}?`,
        { modal: true },
        'Flash',
      );
      if (pick !== 'Flash') return { ok: false, message: 'not approved' };
      approved = true;
    }
    const client = await this.conn.get();
    const lease = this.heldByMe(board.id);
    return vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `fwai: flashing ${board.id}`, cancellable: false },
      async (progress) => {
        let last: FlashProgress | null;
        let frac = 0;
        try {
          last = await flashImage(
            client,
            { deviceId: board.id, imagePath: image, approved: !!approved, leaseId: lease?.lease_id, projectRoot: root },
            (p) => {
              const inc = Math.max(0, p.fraction * 100 - frac);
              frac += inc;
              progress.report({ message: `${p.stage}${p.message ? `: ${p.message}` : ''}`, increment: inc });
            },
          );
        } catch (e) {
          const msg = shown(e);
          this.out.appendLine(`flash ${board.id}: ${msg}`);
          void vscode.window.showErrorMessage(`fwai: ${msg}`);
          return { ok: false, message: msg };
        }
        const msg = `flashed ${board.id}: sha256 ${String(last?.image_sha256 ?? '').slice(0, 12)}…${last?.boot_line ? `, booted: ${last.boot_line}` : ''}`;
        this.out.appendLine(msg);
        void vscode.window.showInformationMessage(`fwai: ${msg}`);
        void this.refresh();
        return { ok: true, message: msg };
      },
    );
  }

  /** The UART, or one of the board's RTT channels when it has them. */
  private async pickStream(board: Device, stream?: string): Promise<StreamChoice | undefined> {
    const choices = streamChoices(board);
    if (stream) {
      return choices.find((c) => c.stream === stream) ?? { stream, label: stream, description: '' };
    }
    if (choices.length === 1) return choices[0];
    const pick = await vscode.window.showQuickPick(
      choices.map((c) => ({ label: c.label, description: c.description, c })),
      { placeHolder: `What to read of ${board.id}` },
    );
    return pick?.c;
  }

  /**
   * A terminal on the board's serial port, or on one of its firmware's RTT
   * channels (picked, or `stream`); typing sends lines when you hold the board.
   */
  async openSerial(d?: Device, stream?: string): Promise<vscode.Terminal | undefined> {
    let board = await this.pickBoard(d, () => true, 'open a serial terminal on');
    if (!board) return;
    // The listing's channels are as of the last refresh; a board just flashed has them now.
    if (!stream) {
      await this.refresh();
      board = this.devices.find((x) => x.id === board?.id) ?? board;
    }
    const choice = await this.pickStream(board, stream);
    if (!choice) return;
    const client = await this.conn.get();
    const lease = this.heldByMe(board.id);
    const what = choice.stream === 'uart' ? 'serial' : choice.label;
    const serial = new SerialSession(client, board.id, {
      stream: choice.stream,
      fromHistory: true,
      leaseId: lease?.lease_id,
      reconnect: true,
      beforeReconnect: () => this.conn.revive(),
    });
    const write = new vscode.EventEmitter<string>();
    const close = new vscode.EventEmitter<number | void>();
    let line = '';
    const pty: vscode.Pseudoterminal = {
      onDidWrite: write.event,
      onDidClose: close.event,
      open: () => {
        write.fire(
          `\x1b[2m— fwai ${what} ${board.id}${lease ? '' : ' (read-only: lease the board to type)'} —\x1b[0m\r\n`,
        );
        serial.on('lines', (ls) => {
          write.fire(ls.map((l) => l.line.replace(/\r?$/, '') + '\r\n').join(''));
        });
        serial.on('notice', (text) => write.fire(`\x1b[33m[fwai] ${text}\x1b[0m\r\n`));
        serial.on('dropped', (n) => write.fire(`\x1b[33m[${n} lines dropped: this terminal fell behind]\x1b[0m\r\n`));
        serial.on('writeError', (m) => write.fire(`\x1b[31m[${m}]\x1b[0m\r\n`));
        serial.on('reconnecting', (reason) =>
          write.fire(`\r\n\x1b[2m— fwaid went away (${reason}); reconnecting… —\x1b[0m\r\n`),
        );
        serial.on('reconnected', (restarted) =>
          write.fire(
            `\x1b[2m— reconnected${restarted ? ' to a restarted fwaid: its output follows' : ''} —\x1b[0m\r\n`,
          ),
        );
        serial.on('end', (reason) => {
          write.fire(`\r\n\x1b[2m— ${what} closed: ${reason} —\x1b[0m\r\n`);
        });
        serial.open().catch((e) => write.fire(`\x1b[31m${shown(e)}\x1b[0m\r\n`));
      },
      close: () => serial.close(),
      handleInput: (data: string) => {
        for (const ch of data) {
          if (ch === '\r') {
            write.fire('\r\n');
            serial.sendLine(line);
            line = '';
          } else if (ch === '\x7f') {
            if (line) {
              line = line.slice(0, -1);
              write.fire('\b \b');
            }
          } else if (ch === '\x03') {
            line = '';
            write.fire('^C\r\n');
          } else if (ch >= ' ') {
            line += ch;
            write.fire(ch);
          }
        }
      },
    };
    const term = vscode.window.createTerminal({
      name: `fwai ${what}: ${board.id}`,
      pty,
      iconPath: new vscode.ThemeIcon('circuit-board'),
    });
    this.terminals.add(term);
    term.show(true);
    return term;
  }

  dispose(): void {
    for (const t of this.timers) clearInterval(t);
    for (const d of this.disposables) d.dispose();
  }
}
