// A board's serial port through the daemon (Hardware.Serial): the daemon owns
// the port, so any number of readers (terminals, the CLI's monitor, skills)
// share it and a flash does not have to take it away from them.
import * as grpc from '@grpc/grpc-js';
import { EventEmitter } from 'node:events';
import { FwaiClient } from './connection';
import { FwaiError, toFwaiError } from './errors';

export interface SerialLine {
  time_us: number;
  line: string;
  seq: number;
}

export declare interface SerialSession {
  on(event: 'opened', listener: (what: string) => void): this;
  on(event: 'lines', listener: (lines: SerialLine[]) => void): this;
  on(event: 'dropped', listener: (count: number) => void): this;
  on(event: 'writeError', listener: (message: string) => void): this;
  on(event: 'end', listener: (reason: string, error: FwaiError | null) => void): this;
}

export class SerialSession extends EventEmitter {
  private call: grpc.ClientDuplexStream<any, any> | null = null;
  private ended = false;
  opened = '';

  constructor(
    private readonly client: FwaiClient,
    readonly deviceId: string,
    private readonly opts: { fromHistory?: boolean; leaseId?: string } = {},
  ) {
    super();
  }

  async open(): Promise<void> {
    const call = await this.client.bidi('Hardware', 'Serial');
    this.call = call;
    const finish = (reason: string, err: FwaiError | null) => {
      if (this.ended) return;
      this.ended = true;
      this.call = null;
      this.emit('end', reason, err);
    };
    call.on('data', (m: any) => {
      if (m.opened) {
        this.opened = m.opened;
        this.emit('opened', m.opened);
      }
      if (m.lines && m.lines.length) this.emit('lines', m.lines as SerialLine[]);
      if (m.dropped) this.emit('dropped', Number(m.dropped));
      if (m.error) this.emit('writeError', m.error);
      if (m.end_of_stream) finish(m.reason || 'the port closed', null);
    });
    call.on('error', (e) => {
      const fe = toFwaiError(e);
      finish(fe.code === grpc.status.CANCELLED ? 'closed' : fe.message, fe.code === grpc.status.CANCELLED ? null : fe);
    });
    call.on('end', () => finish('the daemon ended the stream', null));
    call.write({ open: { device_id: this.deviceId, from_history: !!this.opts.fromHistory, lease_id: this.opts.leaseId ?? '' } });
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
    const c = this.call;
    if (c) {
      c.end();
      c.cancel();
    }
  }
}
