// The extension's one connection to fwaid: built from the settings (address,
// TLS files, token from SecretStorage), started on demand, rebuilt when the
// settings change, and watched so the status bar can say what it is.
import * as path from 'node:path';
import * as vscode from 'vscode';
import * as grpc from '@grpc/grpc-js';
import { FwaiClient, describeAddress, errorAdvice, resolveDaemonAddress, toFwaiError } from '../client';

export type DaemonState = 'disconnected' | 'connecting' | 'connected' | 'error';

export const TOKEN_KEY = 'fwai.daemonToken';

/** The daemon address of the settings, as shown to a user. */
function settingsAddress(): string {
  try {
    return describeAddress(resolveDaemonAddress(vscode.workspace.getConfiguration('fwai').get('daemon')));
  } catch (e) {
    return (e as Error).message;
  }
}

/**
 * True when a failed call means what a view shows is no longer this user's
 * to see: the token or certificate was refused, or the daemon cannot be
 * reached for a reason the probe found (untrusted, nothing listens...).
 * A passing blip (a daemon restarting) keeps the list.
 */
export function staleAfter(e: unknown): boolean {
  const fe = toFwaiError(e);
  return (
    fe.code === grpc.status.UNAUTHENTICATED ||
    fe.code === grpc.status.PERMISSION_DENIED ||
    (fe.code === grpc.status.UNAVAILABLE && fe.unreachable !== null)
  );
}

/** A failed call as a VS Code user reads it: the daemon's words and, for a refused token, the command that fixes it. */
export function shown(e: unknown): string {
  return errorAdvice(e, settingsAddress());
}

export class Connection implements vscode.Disposable {
  private client: FwaiClient | null = null;
  private pending: Promise<FwaiClient> | null = null;
  state: DaemonState = 'disconnected';
  detail = '';
  private readonly changed = new vscode.EventEmitter<void>();
  readonly onDidChange = this.changed.event;
  private readonly reset = new vscode.EventEmitter<void>();
  /** Fired when the client is replaced (settings changed): streams reopen on the new one. */
  readonly onDidReset = this.reset.event;
  private disposables: vscode.Disposable[] = [];
  private watch: NodeJS.Timeout | null = null;
  /** Set while the daemon refuses this user's credentials (what to do about it). */
  private refused = '';

  constructor(
    private readonly ctx: vscode.ExtensionContext,
    private readonly log: vscode.OutputChannel,
  ) {
    this.disposables.push(
      vscode.workspace.onDidChangeConfiguration((e) => {
        if (
          [
            'fwai.daemon',
            'fwai.caFile',
            'fwai.clientCertFile',
            'fwai.clientKeyFile',
            'fwai.fwaidPath',
            'fwai.autoStart',
          ].some((k) => e.affectsConfiguration(k))
        ) {
          void this.restart();
        }
      }),
      ctx.secrets.onDidChange((e) => {
        if (e.key === TOKEN_KEY) void this.restart();
      }),
    );
  }

  private setState(s: DaemonState, detail = ''): void {
    if (s === this.state && detail === this.detail) return;
    this.state = s;
    this.detail = detail;
    this.changed.fire();
  }

  get address(): string {
    return settingsAddress();
  }

  /** The connected client; connects (and starts fwaid if allowed) the first time. */
  get(): Promise<FwaiClient> {
    if (this.client) return Promise.resolve(this.client);
    if (!this.pending) {
      this.pending = this.connect().finally(() => {
        this.pending = null;
      });
    }
    return this.pending;
  }

  /** The client if connected, without connecting. */
  peek(): FwaiClient | null {
    return this.client;
  }

  private async connect(): Promise<FwaiClient> {
    const cfg = vscode.workspace.getConfiguration('fwai');
    this.setState('connecting');
    const t0 = Date.now();
    try {
      const client = FwaiClient.create({
        address: cfg.get<string>('daemon') || undefined,
        protoRoot: path.join(this.ctx.extensionPath, 'dist', 'proto'),
        caFile: cfg.get<string>('caFile') || undefined,
        certFile: cfg.get<string>('clientCertFile') || undefined,
        keyFile: cfg.get<string>('clientKeyFile') || undefined,
        token: () => this.ctx.secrets.get(TOKEN_KEY),
        clientName: `vscode ${vscode.version} pid ${process.pid}`,
        autoStart: cfg.get<boolean>('autoStart', true),
        fwaidPath: cfg.get<string>('fwaidPath') || undefined,
      });
      try {
        const how = await client.ensureReachable(15000);
        if (how === 'started') this.log.appendLine(`started fwaid on ${describeAddress(client.address)}`);
      } catch (e) {
        client.close();
        throw e;
      }
      this.client = client;
      this.log.appendLine(`connected to fwaid at ${describeAddress(client.address)} in ${Date.now() - t0} ms`);
      this.setState('connected', describeAddress(client.address));
      this.startWatching();
      return client;
    } catch (e) {
      const msg = (e as Error).message;
      this.log.appendLine(`cannot connect: ${msg}`);
      this.setState('error', msg);
      throw e;
    }
  }

  /** A call failed: a refused token or certificate makes the state 'error' until a call succeeds. */
  noteFailure(e: unknown): void {
    if (toFwaiError(e).code !== grpc.status.UNAUTHENTICATED) return;
    this.refused = shown(e);
    this.setState('error', this.refused);
  }

  /** A call succeeded: the credentials are accepted. */
  noteSuccess(): void {
    if (!this.refused) return;
    this.refused = '';
    if (this.client) this.setState('connected', describeAddress(this.client.address));
  }

  /** Follows the channel's state (ready / connecting / transient failure) for the status bar. */
  private startWatching(): void {
    if (this.watch) clearInterval(this.watch);
    this.watch = setInterval(() => {
      const c = this.client;
      if (!c) return;
      // 2 = READY, 0 = IDLE (no call yet): both mean the daemon answers.
      const st = (c.stubs.Daemon.getChannel() as any).getConnectivityState(false);
      if (this.refused) this.setState('error', this.refused);
      else if (st === 2 || st === 0) this.setState('connected', describeAddress(c.address));
      else if (st === 3) this.setState('connecting', 'reconnecting to fwaid…');
    }, 1000);
  }

  /** Starts fwaid again if it is gone (default socket, autoStart); used before each stream reconnect. */
  async revive(): Promise<void> {
    const c = this.client;
    if (!c) return;
    try {
      await c.ensureReachable(5000);
      this.setState('connected', describeAddress(c.address));
    } catch (e) {
      this.setState('connecting', (e as Error).message);
    }
  }

  async restart(): Promise<void> {
    const old = this.client;
    this.client = null;
    this.refused = '';
    old?.close();
    this.setState('disconnected');
    this.reset.fire();
  }

  dispose(): void {
    if (this.watch) clearInterval(this.watch);
    this.client?.close();
    for (const d of this.disposables) d.dispose();
  }
}
