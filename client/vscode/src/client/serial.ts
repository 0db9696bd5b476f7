// A board's serial port through the daemon (Hardware.Serial): the daemon owns
// the port, so any number of readers (terminals, the CLI's monitor, skills)
// share it and a flash does not have to take it away from them.
//
// With `reconnect`, a stream that breaks because fwaid went away (stopped,
// restarted, killed) is opened again once fwaid answers, instead of ending:
// an end is final only when the same fwaid that served the stream is still
// there (the lease ended, the port closed, the caller may not read it).
import * as grpc from '@grpc/grpc-js';
import { EventEmitter } from 'node:events';
import type { SerialClientMessage } from '../generated/fwai/v1/SerialClientMessage';
import type { SerialLine__Output } from '../generated/fwai/v1/SerialLine';
import type { SerialServerMessage__Output } from '../generated/fwai/v1/SerialServerMessage';
import { FwaiClient } from './connection';
import { daemonStatus } from './daemon';
import { FwaiError, toFwaiError } from './errors';

export type SerialLine = SerialLine__Output;

export interface SerialOptions {
  /** What to read: "uart" (the default) or "rtt:N", the firmware's RTT channel N. */
  stream?: string;
  fromHistory?: boolean;
  leaseId?: string;
  /** Open the stream again when fwaid goes away and comes back. */
  reconnect?: boolean;
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** Run before each reconnect attempt (e.g. start fwaid again on the default socket). */
  beforeReconnect?: () => Promise<unknown>;
}

export declare interface SerialSession {
  on(event: 'opened', listener: (what: string) => void): this;
  on(event: 'lines', listener: (lines: SerialLine[]) => void): this;
  /** fwaid's word about the board (a watch on it fired), not the board's output. */
  on(event: 'notice', listener: (text: string) => void): this;
  on(event: 'dropped', listener: (count: number) => void): this;
  on(event: 'writeError', listener: (message: string) => void): this;
  /** The stream broke because fwaid went away; it is being opened again. */
  on(event: 'reconnecting', listener: (reason: string) => void): this;
  /** Opened again after `reconnecting`; `restarted` when it is another fwaid (its history is new). */
  on(event: 'reconnected', listener: (restarted: boolean) => void): this;
  on(event: 'end', listener: (reason: string, error: FwaiError | null) => void): this;
}

/** Which fwaid process served a stream (pid and start time). */
type DaemonIdentity = string;

export class SerialSession extends EventEmitter {
  private call: grpc.ClientDuplexStream<SerialClientMessage, SerialServerMessage__Output> | null = null;
  private ended = false;
  private closing = false;
  private daemon: DaemonIdentity | null = null;
  private lastSeq = 0;
  private backoff: number;
  private timer: NodeJS.Timeout | null = null;
  reconnects = 0;
  opened = '';
  /** The stream the daemon said it serves ("uart", "rtt:0"), once opened. */
  stream = '';

  constructor(
    private readonly client: FwaiClient,
    readonly deviceId: string,
    private readonly opts: SerialOptions = {},
  ) {
    super();
    this.backoff = opts.minBackoffMs ?? 100;
  }

  private async identity(): Promise<DaemonIdentity | null> {
    try {
      const s = await daemonStatus(this.client, 3000);
      return `${s.pid}@${s.started_us}`;
    } catch {
      return null;
    }
  }

  private finish(reason: string, err: FwaiError | null): void {
    if (this.ended) return;
    this.ended = true;
    this.call = null;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.emit('end', reason, err);
  }

  async open(): Promise<void> {
    if (this.opts.reconnect) this.daemon = await this.identity();
    await this.connect(this.opts.fromHistory ?? false, false);
  }

  private async connect(fromHistory: boolean, again: boolean): Promise<void> {
    const call = await this.client.bidi('Hardware', 'Serial');
    if (this.closing || this.ended) {
      call.cancel();
      return;
    }
    this.call = call;
    let broken = false;
    const brokenOff = (reason: string, err: FwaiError | null, final: boolean) => {
      if (broken) return;
      broken = true;
      if (this.call === call) this.call = null;
      void this.onBroken(reason, err, final);
    };
    const restarted = again && fromHistory;
    call.on('data', (m: SerialServerMessage__Output) => {
      if (m.opened) {
        this.opened = m.opened;
        this.stream = m.stream || 'uart';
        this.backoff = this.opts.minBackoffMs ?? 100;
        if (again) this.emit('reconnected', restarted);
        else this.emit('opened', m.opened);
      }
      if (m.lines && m.lines.length) {
        let lines = m.lines as SerialLine[];
        for (const l of lines) if (l.notice) this.emit('notice', l.line);
        lines = lines.filter((l) => !l.notice);
        // The same fwaid replays nothing twice; another one numbers its lines afresh.
        if (again && !restarted) lines = lines.filter((l) => Number(l.seq) > this.lastSeq);
        if (lines.length) {
          this.lastSeq = Number(lines[lines.length - 1].seq);
          this.emit('lines', lines);
        }
      }
      if (m.dropped) this.emit('dropped', Number(m.dropped));
      if (m.error) this.emit('writeError', m.error);
      if (m.end_of_stream) brokenOff(m.reason || 'the port closed', null, !m.daemon_stopping);
    });
    call.on('error', (e) => {
      const fe = toFwaiError(e);
      if (this.closing || fe.code === grpc.status.CANCELLED) brokenOff('closed', fe, false);
      else brokenOff(fe.message, fe, false);
    });
    call.on('end', () => brokenOff('the daemon ended the stream', null, false));
    call.write({
      open: {
        device_id: this.deviceId,
        from_history: fromHistory,
        lease_id: this.opts.leaseId ?? '',
        stream: this.opts.stream ?? '',
      },
    });
  }

  /** `final`: the daemon ended the stream on purpose (end of stream, not because it stops). */
  private async onBroken(reason: string, err: FwaiError | null, final: boolean): Promise<void> {
    if (this.ended) return;
    if (this.closing) {
      this.finish('closed', null);
      return;
    }
    if (!this.opts.reconnect) {
      this.finish(reason, err && err.code === grpc.status.CANCELLED ? null : err);
      return;
    }
    // Final unless fwaid itself went away: the fwaid that served us still
    // answering means the end was meant (lease ended, access refused...).
    const now = await this.identity();
    if (this.closing) {
      this.finish('closed', null);
      return;
    }
    const gone = now === null || now !== this.daemon;
    if (!gone && (final || (err && err.code !== grpc.status.UNAVAILABLE))) {
      this.finish(reason, err);
      return;
    }
    this.emit('reconnecting', reason);
    this.schedule();
  }

  private schedule(): void {
    const delay = this.backoff;
    this.backoff = Math.min(this.backoff * 2, this.opts.maxBackoffMs ?? 3000);
    this.timer = setTimeout(async () => {
      this.timer = null;
      if (this.closing || this.ended) return;
      this.reconnects++;
      try {
        await this.opts.beforeReconnect?.();
      } catch {
        // The next attempt says why, if it still fails.
      }
      const now = await this.identity();
      if (this.closing || this.ended) return;
      if (now === null) {
        this.schedule();
        return;
      }
      const restarted = now !== this.daemon;
      this.daemon = now;
      try {
        // Another fwaid: everything its port has seen is new to this reader.
        await this.connect(restarted, true);
      } catch (e) {
        const fe = toFwaiError(e);
        if (fe.code === grpc.status.UNAVAILABLE) this.schedule();
        else this.finish(fe.message, fe);
      }
    }, delay);
  }

  /** Raw bytes to the port (needs the board's lease). */
  write(data: string | Buffer): void {
    this.call?.write({ write: typeof data === 'string' ? Buffer.from(data, 'utf8') : data });
  }
  /** One command line; the board's line ending is appended by the daemon. */
  sendLine(text: string): void {
    this.call?.write({ send_line: text });
  }
  get isOpen(): boolean {
    return !!this.call && !this.ended;
  }
  close(): void {
    this.closing = true;
    const c = this.call;
    if (c) {
      c.end();
      c.cancel();
    } else {
      this.finish('closed', null);
    }
  }
}
