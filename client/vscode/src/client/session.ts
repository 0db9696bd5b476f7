// One session's live stream over Sessions.Chat: replays what was stored after
// the last seq it saw, then follows live; sends messages, answers, plan
// decisions, cancels, mode changes. When the stream breaks (daemon restarted,
// network, a slow-client drop) it reconnects on its own and resumes from the
// last seq, so nothing is lost or seen twice.
import * as grpc from '@grpc/grpc-js';
import { EventEmitter } from 'node:events';
import { FwaiClient } from './connection';
import { FwaiError, isTransient, toFwaiError } from './errors';
import type { ClientEvent } from '../generated/fwai/v1/ClientEvent';
import { ServerEvent } from './events';

export type StreamState = 'connecting' | 'open' | 'reconnecting' | 'closed';

export interface SessionStreamOptions {
  /** Replay stored events after this seq (0: from the start). */
  afterSeq?: number;
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** Run before each reconnect (e.g. start fwaid again on the default socket). */
  beforeReconnect?: () => Promise<unknown>;
}

let turnCounter = 0;
export function newTurnId(): string {
  return `t-vs${Date.now().toString(36)}${(turnCounter++).toString(36)}${Math.floor(Math.random() * 1e6).toString(36)}`;
}

export declare interface SessionStream {
  on(event: 'event', listener: (ev: ServerEvent) => void): this;
  on(event: 'state', listener: (state: StreamState, detail: string) => void): this;
  on(event: 'fatal', listener: (err: FwaiError) => void): this;
}

export class SessionStream extends EventEmitter {
  state: StreamState = 'closed';
  lastSeq: number;
  reconnects = 0;
  private call: grpc.ClientDuplexStream<ClientEvent, ServerEvent> | null = null;
  private closed = false;
  private backoff: number;
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly client: FwaiClient,
    readonly sessionId: string,
    private readonly opts: SessionStreamOptions = {},
  ) {
    super();
    this.lastSeq = opts.afterSeq ?? 0;
    this.backoff = opts.minBackoffMs ?? 100;
  }

  start(): void {
    this.closed = false;
    void this.connect();
  }

  private setState(s: StreamState, detail = ''): void {
    this.state = s;
    this.emit('state', s, detail);
  }

  private async connect(): Promise<void> {
    if (this.closed) return;
    this.setState(this.reconnects ? 'reconnecting' : 'connecting');
    let call: grpc.ClientDuplexStream<ClientEvent, ServerEvent>;
    try {
      call = await this.client.bidi('Sessions', 'Chat');
    } catch (e) {
      this.onBroken(toFwaiError(e));
      return;
    }
    if (this.closed) {
      call.cancel();
      return;
    }
    this.call = call;
    let ended = false;
    const end = (err: FwaiError | null) => {
      if (ended) return;
      ended = true;
      if (this.call === call) this.call = null;
      if (this.closed) return;
      this.onBroken(err ?? new FwaiError(grpc.status.UNAVAILABLE, 'the daemon ended the stream'));
    };
    // Open once fwaid has accepted the stream (its headers, sent when it
    // takes the `open`), not when the call is made: a call made while the
    // connection is still coming back fails at once, and a message written
    // to it would be lost.
    const accepted = () => {
      if (!ended && this.call === call && !this.closed && this.state !== 'open') this.setState('open');
    };
    call.on('metadata', accepted);
    call.on('data', (ev: ServerEvent) => {
      accepted();
      this.backoff = this.opts.minBackoffMs ?? 100;
      if (ev.seq && ev.seq <= this.lastSeq) return; // replayed twice across a reconnect
      if (ev.seq) this.lastSeq = ev.seq;
      this.emit('event', ev);
    });
    call.on('error', (e) => end(toFwaiError(e)));
    call.on('end', () => end(null));
    call.write({ open: { session_id: this.sessionId, after_seq: this.lastSeq, replay: true } });
  }

  private onBroken(err: FwaiError): void {
    if (this.closed) return;
    if (!isTransient(err.code)) {
      this.closed = true;
      this.setState('closed', err.message);
      this.emit('fatal', err);
      return;
    }
    this.setState('reconnecting', err.message);
    const delay = this.backoff;
    this.backoff = Math.min(this.backoff * 2, this.opts.maxBackoffMs ?? 3000);
    this.timer = setTimeout(async () => {
      this.timer = null;
      this.reconnects++;
      try {
        await this.opts.beforeReconnect?.();
      } catch {
        // The next attempt says why, if it still fails.
      }
      void this.connect();
    }, delay);
  }

  private write(msg: ClientEvent): void {
    if (!this.call || this.state !== 'open') {
      throw new FwaiError(grpc.status.UNAVAILABLE, 'not connected to fwaid (reconnecting); try again in a moment');
    }
    this.call.write(msg);
  }

  /** Starts a turn; returns its id. */
  sendMessage(text: string, o: { provider?: string; model?: string; turnId?: string } = {}): string {
    const turn_id = o.turnId ?? newTurnId();
    this.write({ message: { text, provider: o.provider ?? '', model: o.model ?? '', turn_id } });
    return turn_id;
  }
  cancel(): void {
    this.write({ cancel: {} });
  }
  answer(questionId: string, selected: string[], text = ''): void {
    this.write({ answer: { question_id: questionId, selected, text } });
  }
  decidePlan(planId: string, d: { approve: boolean; editedPlan?: string; feedback?: string }): void {
    this.write({
      plan_decision: {
        plan_id: planId,
        approve: d.approve,
        edited_plan: d.editedPlan ?? '',
        feedback: d.feedback ?? '',
      },
    });
  }
  /** Ask before edits on or off (refused by fwaid while a turn runs). */
  setEditApproval(askBeforeEdits: boolean): void {
    this.write({ set_edit_approval: { ask_before_edits: askBeforeEdits } });
  }

  setMode(mode: 'plan' | 'act'): void {
    this.write({ set_mode: { mode } });
  }
  compact(): string {
    const turn_id = newTurnId();
    this.write({ compact: { turn_id } });
    return turn_id;
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const c = this.call;
    this.call = null;
    if (c) {
      c.end();
      c.cancel();
    }
    if (this.state !== 'closed') this.setState('closed');
  }
}
