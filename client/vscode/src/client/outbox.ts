// Events waiting to go to a view that draws them, with consecutive text
// deltas of one stream joined: a view behind by a hundred deltas gets one
// text to append, not a hundred. Pure: no Node or vscode imports.
import type { ServerEvent } from './events';

/** An event waiting; in measurements, each delta it holds as [daemon time_us, when it arrived (ms)]. */
export interface Outgoing {
  ev: ServerEvent;
  perf: [number, number][];
}

export class EventOutbox {
  private items: Outgoing[] = [];

  /**
   * Adds an event. A text delta right after one of the same stream (session,
   * turn, agent, thinking or not) is joined to it and carries the later seq,
   * as fwaid's own coalescing does; anything between keeps them apart.
   * `arrivedMs` is kept only when measuring (non-zero).
   */
  push(ev: ServerEvent, arrivedMs = 0): void {
    const last = this.items[this.items.length - 1];
    const sample: [number, number][] = arrivedMs ? [[Number(ev.time_us), arrivedMs]] : [];
    if (last && sameTextStream(last.ev, ev)) {
      const text = (last.ev.text_delta?.text ?? '') + (ev.text_delta?.text ?? '');
      last.ev = { ...last.ev, seq: ev.seq, text_delta: { ...last.ev.text_delta!, text } };
      last.perf.push(...sample);
    } else {
      this.items.push({ ev, perf: sample });
    }
  }

  get size(): number {
    return this.items.length;
  }

  /** Everything waiting, oldest first; the outbox is empty after. */
  take(): Outgoing[] {
    const out = this.items;
    this.items = [];
    return out;
  }
}

function sameTextStream(a: ServerEvent, b: ServerEvent): boolean {
  if (a.payload !== 'text_delta' || b.payload !== 'text_delta') return false;
  const x = a.text_delta!;
  const y = b.text_delta!;
  return (
    a.session_id === b.session_id &&
    a.turn_id === b.turn_id &&
    !!x.thinking === !!y.thinking &&
    (x.origin?.agent ?? '') === (y.origin?.agent ?? '') &&
    (x.origin?.parent_call_id ?? '') === (y.origin?.parent_call_id ?? '')
  );
}
