// A connection to fwaid: one gRPC channel (unix socket, loopback TCP, or TLS
// with an optional client certificate), every service's stub on it, and the
// metadata each call carries (`fwai-client`, and `authorization: Bearer` for
// a daemon that wants a token).
import * as grpc from '@grpc/grpc-js';
import * as fs from 'node:fs';
import { DaemonAddress, Env, describeAddress, isLocal, resolveDaemonAddress } from './address';
import { ensureDaemon } from './autostart';
import { FwaiError, toFwaiError } from './errors';
import { loadFwaiPackage } from './proto';
import { Unreachable, whyUnreachable } from './reach';
import type {
  BidiMethod,
  BidiRequest,
  BidiResponse,
  ServerStreamMethod,
  ServerStreamRequest,
  ServerStreamResponse,
  ServiceClients,
  ServiceName,
  UnaryMethod,
  UnaryRequest,
  UnaryResponse,
} from './rpc';

export interface ConnectOptions {
  /** The `fwai.daemon` setting; empty: $FWAI_DAEMON, else the default socket. */
  address?: string;
  env?: Env;
  /** Folder holding fwai/v1/*.proto. */
  protoRoot: string;
  /** TLS: CA bundle (PEM); empty: the system's roots. */
  caFile?: string;
  /** mTLS client certificate and key (PEM). */
  certFile?: string;
  keyFile?: string;
  /** Bearer token, or a function that fetches it (e.g. from SecretStorage). */
  token?: string | (() => PromiseLike<string | undefined> | string | undefined);
  /** Shown by the daemon as "alice (uid 1000) via <clientName>". */
  clientName?: string;
  /** Start fwaid when nothing listens on the default socket. */
  autoStart?: boolean;
  fwaidPath?: string;
  connectTimeoutMs?: number;
}

// Every service of ServiceClients gets a stub (one missing here does not compile).
const SERVICES = Object.keys({
  Sessions: true,
  Daemon: true,
  Hardware: true,
  Skills: true,
  Projects: true,
  Knowledge: true,
  Evidence: true,
  Firmware: true,
  Ota: true,
} satisfies Record<ServiceName, true>) as ServiceName[];

/** Channel options: fast reconnects (a restarted daemon is back in ~100 ms), big messages (exports). */
const CHANNEL_OPTIONS: grpc.ChannelOptions = {
  'grpc.max_receive_message_length': 64 << 20,
  'grpc.max_send_message_length': 64 << 20,
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': 2000,
  'grpc.keepalive_time_ms': 30000,
  'grpc.keepalive_timeout_ms': 10000,
};

function readPem(file: string | undefined, what: string): Buffer | null {
  if (!file) return null;
  try {
    return fs.readFileSync(file);
  } catch (e) {
    throw new Error(`${what} ${file}: ${(e as Error).message}`);
  }
}

export function makeCredentials(
  addr: DaemonAddress,
  opts: Pick<ConnectOptions, 'caFile' | 'certFile' | 'keyFile'>,
): grpc.ChannelCredentials {
  if (addr.kind !== 'tls') {
    if (opts.certFile || opts.caFile) {
      // Settings for TLS on a plaintext address are most likely a mistake: say so.
      throw new Error(
        `fwai.caFile / fwai.clientCertFile are set but the daemon address ${describeAddress(addr)} is not tls:`,
      );
    }
    return grpc.credentials.createInsecure();
  }
  const ca = readPem(opts.caFile, 'fwai.caFile');
  const cert = readPem(opts.certFile, 'fwai.clientCertFile');
  const key = readPem(opts.keyFile, 'fwai.clientKeyFile');
  if (!!cert !== !!key) throw new Error('mutual TLS needs both fwai.clientCertFile and fwai.clientKeyFile');
  return grpc.credentials.createSsl(ca, key, cert);
}

export class FwaiClient {
  /** Each service's stub, typed by the generated client interfaces. */
  readonly stubs: ServiceClients;
  private constructor(
    readonly address: DaemonAddress,
    private readonly opts: ConnectOptions,
    creds: grpc.ChannelCredentials,
  ) {
    const pkg = loadFwaiPackage(opts.protoRoot);
    const stubs: Partial<Record<ServiceName, grpc.Client>> = {};
    let channel: grpc.Channel | undefined;
    for (const name of SERVICES) {
      const Ctor = pkg[name];
      const c = channel
        ? new Ctor(address.target, creds, { ...CHANNEL_OPTIONS, channelOverride: channel })
        : new Ctor(address.target, creds, CHANNEL_OPTIONS);
      channel ??= c.getChannel() as grpc.Channel;
      stubs[name] = c;
    }
    this.stubs = stubs as unknown as ServiceClients;
  }

  /** The client without waiting for the daemon (calls wait for the channel themselves). */
  static create(opts: ConnectOptions): FwaiClient {
    const addr = resolveDaemonAddress(opts.address, opts.env ?? process.env);
    return new FwaiClient(addr, opts, makeCredentials(addr, opts));
  }

  /**
   * Resolves the address, starts fwaid on the default socket when allowed and
   * needed, and waits until the channel is ready.
   */
  static async connect(opts: ConnectOptions): Promise<FwaiClient> {
    const client = FwaiClient.create(opts);
    try {
      await client.ensureReachable(opts.connectTimeoutMs ?? 5000);
    } catch (e) {
      client.close();
      throw e;
    }
    return client;
  }

  /** For the default socket with autoStart: starts fwaid if it is not running. Then waits for the channel. */
  async ensureReachable(timeoutMs: number): Promise<'running' | 'started'> {
    let how: 'running' | 'started' = 'running';
    if (this.address.kind === 'unix' && this.address.isDefault && this.opts.autoStart) {
      how = await ensureDaemon(this.opts.fwaidPath ?? '', this.address.path);
    }
    await this.waitForReady(timeoutMs);
    return how;
  }

  /**
   * Waits until the channel is ready. Over TCP, when it is not ready within a
   * second a probe of our own looks for why; a definite answer (untrusted,
   * nothing listens, another host...) ends the wait at once instead of at
   * the deadline, and the error says what to change.
   */
  waitForReady(timeoutMs: number): Promise<void> {
    return new Promise((resolve, reject) => {
      let settled = false;
      const hint =
        this.address.kind === 'unix'
          ? this.address.isDefault
            ? ' (start it with `fwai daemon start`, or enable fwai.autoStart)'
            : ` (start it with: fwaid --listen unix:${this.address.path})`
          : '';
      const fail = (why: Unreachable | null) => {
        if (settled) return;
        settled = true;
        reject(
          new FwaiError(
            grpc.status.UNAVAILABLE,
            `cannot reach fwaid at ${describeAddress(this.address)}${why ? `: ${why.message}` : hint}`,
            why,
          ),
        );
      };
      const probeMs = Math.min(Math.max(timeoutMs, 500), 3000);
      const early =
        this.address.kind === 'unix'
          ? null
          : setTimeout(
              async () => {
                const why = await whyUnreachable(this.address, this.opts, probeMs);
                if (why && why.kind !== 'timeout') fail(why);
              },
              Math.min(1000, timeoutMs / 2),
            );
      this.stubs.Daemon.waitForReady(Date.now() + timeoutMs, async (err) => {
        if (early) clearTimeout(early);
        if (settled) return;
        if (!err) {
          settled = true;
          return resolve();
        }
        fail(await whyUnreachable(this.address, this.opts, probeMs));
      });
    });
  }

  /** Per-call metadata: who is calling, and the bearer token where one is configured. */
  async metadata(): Promise<grpc.Metadata> {
    const md = new grpc.Metadata();
    md.set('fwai-client', this.opts.clientName ?? `vscode pid ${process.pid}`);
    const t = typeof this.opts.token === 'function' ? await this.opts.token() : this.opts.token;
    if (t) {
      if (this.address.kind !== 'tls' && !isLocal(this.address)) {
        throw new FwaiError(
          grpc.status.FAILED_PRECONDITION,
          `refusing to send the token in clear text to ${describeAddress(this.address)}: use a tls: address`,
        );
      }
      md.set('authorization', `Bearer ${t}`);
    }
    return md;
  }

  /** The stub's method `method` of `service`, or an error naming what does not exist (for untyped callers). */
  private method(service: ServiceName, method: string): (...args: unknown[]) => any {
    const stub = this.stubs[service] as unknown as Record<string, unknown> | undefined;
    const fn = stub?.[method];
    if (!stub || typeof fn !== 'function') {
      throw new Error(`fwai API: ${service}.${method} does not exist`);
    }
    return (fn as (...args: unknown[]) => any).bind(stub);
  }

  /**
   * One unary call; rejects with a FwaiError carrying the daemon's message.
   * Service, method, request and response are the generated types':
   * `call('Hardware', 'Acquire', { device_id })` answers a `Lease`.
   */
  async call<S extends ServiceName, const M extends UnaryMethod<S>>(
    service: S,
    method: M,
    request: UnaryRequest<S, M>,
    timeoutMs = 30000,
  ): Promise<UnaryResponse<S, M>> {
    const md = await this.metadata();
    const fn = this.method(service, method);
    return new Promise<UnaryResponse<S, M>>((resolve, reject) => {
      fn(
        request,
        md,
        { deadline: Date.now() + timeoutMs },
        (err: grpc.ServiceError | null, resp: UnaryResponse<S, M>) => (err ? reject(toFwaiError(err)) : resolve(resp)),
      );
    });
  }

  /** A server-streaming call. */
  async serverStream<S extends ServiceName, const M extends ServerStreamMethod<S>>(
    service: S,
    method: M,
    request: ServerStreamRequest<S, M>,
  ): Promise<grpc.ClientReadableStream<ServerStreamResponse<S, M>>> {
    const md = await this.metadata();
    return this.method(service, method)(request, md);
  }

  /** A bidirectional call. */
  async bidi<S extends ServiceName, const M extends BidiMethod<S>>(
    service: S,
    method: M,
  ): Promise<grpc.ClientDuplexStream<BidiRequest<S, M>, BidiResponse<S, M>>> {
    const md = await this.metadata();
    return this.method(service, method)(md);
  }

  close(): void {
    // All stubs share one channel: closing one closes it.
    this.stubs.Daemon.close();
  }
}
