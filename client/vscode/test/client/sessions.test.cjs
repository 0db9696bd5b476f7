// The client library against a real fwaid and the fake LLM service: chat
// turns into a tree, attach/replay, questions and plans, two clients, resuming
// after the stream breaks and after the daemon restarts.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { FakeLlm, Daemon, PROTO_ROOT, waitFor } = require('../support/fixtures.cjs');
const lib = require('../../out/client.js');

let fake;
before(async () => {
  fake = await FakeLlm.start();
});
after(() => fake?.stop());

async function connect(d, extra = {}) {
  return lib.FwaiClient.connect({ address: d.address, protoRoot: PROTO_ROOT, clientName: 'vscode-test', ...extra });
}

async function createSession(client, d, o = {}) {
  return client.call('Sessions', 'Create', {
    title: o.title ?? 'test',
    project_root: d.project,
    mode: o.mode ?? 'act',
  });
}

/** Collects a stream's events into a model until `pred(model, ev)` holds. */
function follow(stream, model = new lib.SessionModel(stream.sessionId)) {
  const seen = [];
  const waiters = [];
  stream.on('event', (ev) => {
    seen.push(ev);
    model.apply(ev);
    for (const w of [...waiters]) {
      if (w.pred(model, ev)) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(ev);
      }
    }
  });
  const until = (pred, what = 'an event', ms = 20000) =>
    new Promise((resolve, reject) => {
      for (const ev of seen) if (pred(model, ev)) return resolve(ev);
      const w = { pred, resolve };
      waiters.push(w);
      setTimeout(() => {
        if (waiters.includes(w)) reject(new Error(`timed out waiting for ${what}; outline:\n${model.outline()}`));
      }, ms);
    });
  return { model, seen, until };
}

const turnDone = (turnId) => (m, ev) => ev.payload === 'turn_finished' && ev.turn_id === turnId;

async function storedEvents(client, sessionId) {
  const s = await client.serverStream('Sessions', 'Attach', { session_id: sessionId, after_seq: 0, no_follow: true });
  const out = [];
  return new Promise((resolve, reject) => {
    s.on('data', (e) => out.push(e));
    s.on('end', () => resolve(out));
    s.on('error', reject);
  });
}

test('a chat turn with a sub-agent becomes a tree nested by parent_call_id, with usage and cost', async (t) => {
  const d = new Daemon(fake);
  t.after(() => d.cleanup());
  await d.start();
  fs.writeFileSync(path.join(d.project, 'main.c'), 'int counter = 42;\n');
  await fake.reset();
  await fake.enqueue([
    {
      match: 'where is counter',
      tool_calls: [
        {
          id: 'd1',
          name: 'delegateSubagent',
          input: { agent_type: 'codebase-explorer', task: 'find counter in the sources' },
        },
      ],
      input_tokens: 100,
      output_tokens: 20,
    },
    { match: 'find counter in the sources', tool_calls: [{ id: 'r1', name: 'read_file', input: { path: 'main.c' } }] },
    { match: 'find counter in the sources', chunks: ['counter is ', 'in main.c:1'] },
    { match: 'where is counter', chunks: ['It is **42**, ', 'see `main.c:1`.'], input_tokens: 200, output_tokens: 30 },
  ]);
  const client = await connect(d);
  t.after(() => client.close());
  const status = await client.call('Daemon', 'Status', {});
  assert.match(status.caller, /^uid:\d+$/);
  const s = await createSession(client, d);
  const stream = new lib.SessionStream(client, s.id);
  const f = follow(stream);
  stream.start();
  await waitFor(() => stream.state === 'open', 'the stream to open');
  const turnId = stream.sendMessage('where is counter?');
  await f.until(turnDone(turnId), 'the turn to finish');
  stream.close();
  const m = f.model;
  assert.equal(
    m.outline(turnId),
    [
      'delegateSubagent(main) [ok]',
      '  read_file(codebase-explorer) [ok]',
      '  text(codebase-explorer): counter is in main.c:1',
      'text(main): It is **42**, see `main.c:1`.',
    ].join('\n'),
  );
  const turn = m.turnById.get(turnId);
  assert.equal(turn.userText, 'where is counter?');
  assert.equal(turn.running, false);
  assert.equal(turn.stopReason, 'end_turn');
  assert.ok(turn.usage.input_tokens >= 300, JSON.stringify(turn.usage));
  const read = m.calls.get('r1');
  assert.equal(read.parentCallId, 'd1');
  assert.match(read.result, /counter = 42/);
  assert.ok(m.calls.get('d1').durationMs >= 0);
  assert.deepEqual(
    lib.findFileRefs(turn.items[1].text).map((r) => `${r.path}:${r.line}`),
    ['main.c:1'],
  );
});

test('attach replays the whole history, or only what came after a seq, then follows live', async (t) => {
  const d = new Daemon(fake);
  t.after(() => d.cleanup());
  await d.start();
  await fake.reset();
  const client = await connect(d);
  t.after(() => client.close());
  const s = await createSession(client, d);
  await fake.enqueue([
    { match: 'first', chunks: ['one'] },
    { match: 'first', chunks: ['two'] },
  ]);
  const a = new lib.SessionStream(client, s.id);
  const fa = follow(a);
  a.start();
  await waitFor(() => a.state === 'open', 'open');
  const t1 = a.sendMessage('first');
  await fa.until(turnDone(t1));
  const t2 = a.sendMessage('second');
  await fa.until(turnDone(t2));
  const stored = await storedEvents(client, s.id);
  assert.deepEqual(
    fa.seen.map((e) => e.seq),
    stored.map((e) => e.seq),
  );
  // A new client from 0 sees the same tree.
  const b = new lib.SessionStream(client, s.id);
  const fb = follow(b);
  b.start();
  await fb.until(turnDone(t2));
  assert.equal(fb.model.outline(t1), fa.model.outline(t1));
  assert.equal(fb.model.outline(t2), fa.model.outline(t2));
  // From the middle: only later events.
  const mid = stored.find((e) => e.payload === 'turn_finished').seq;
  const c = new lib.SessionStream(client, s.id, { afterSeq: mid });
  const fc = follow(c);
  c.start();
  await fc.until(turnDone(t2));
  assert.ok(fc.seen.every((e) => e.seq > mid));
  assert.equal(fc.model.turnById.has(t1), false);
  // Live: a turn from client A reaches B and C.
  await fake.enqueue([{ chunks: ['three'] }]);
  const t3 = a.sendMessage('third');
  await Promise.all([fb.until(turnDone(t3)), fc.until(turnDone(t3))]);
  assert.match(fb.model.outline(t3), /text\(main\): three/);
  for (const x of [a, b, c]) x.close();
});

test('a question is answered in place; two clients answer, the first wins and both see who', async (t) => {
  const d = new Daemon(fake);
  t.after(() => d.cleanup());
  await d.start();
  await fake.reset();
  await fake.enqueue([
    {
      tool_calls: [
        {
          id: 'q1',
          name: 'askQuestion',
          input: { questions: [{ text: 'Which UART?', options: ['USART1', 'USART2'] }] },
        },
      ],
    },
    { chunks: ['using it'] },
  ]);
  const client = await connect(d, { clientName: 'vscode A' });
  const client2 = await connect(d, { clientName: 'vscode B' });
  t.after(() => {
    client.close();
    client2.close();
  });
  const s = await createSession(client, d);
  const a = new lib.SessionStream(client, s.id);
  const b = new lib.SessionStream(client2, s.id);
  const fa = follow(a);
  const fb = follow(b);
  a.start();
  b.start();
  await waitFor(() => a.state === 'open' && b.state === 'open', 'open');
  const turnId = a.sendMessage('set up the console');
  await fa.until((m) => m.question !== null, 'the question');
  await fb.until((m) => m.question !== null, 'the question at B');
  const q = fb.model.question;
  assert.equal(q.questions[0].text, 'Which UART?');
  assert.deepEqual(
    q.questions[0].options.map((o) => o.label),
    ['USART1', 'USART2'],
  );
  b.answer(q.questionId, ['USART2']);
  await fb.until((m, ev) => ev.payload === 'question_answered');
  a.answer(q.questionId, ['USART1']); // late: refused quietly, A's stream stays open
  await fa.until(turnDone(turnId));
  await fb.until(turnDone(turnId));
  assert.equal(a.state, 'open');
  assert.equal(fa.model.question, null);
  assert.equal(fa.model.lastResolution.summary, 'USART2');
  assert.match(fa.model.lastResolution.by, /via vscode B/);
  assert.match(fa.model.calls.get('q1').result, /USART2/);
  assert.doesNotMatch(fa.model.calls.get('q1').result, /USART1/);
  a.close();
  b.close();
});

test('a plan is approved as edited: the edited text is what the daemon keeps and acts on', async (t) => {
  const d = new Daemon(fake);
  t.after(() => d.cleanup());
  await d.start();
  await fake.reset();
  const client = await connect(d);
  t.after(() => client.close());
  const s = await createSession(client, d, { mode: 'plan' });
  const planPath = `.fwai/plans/${s.id}.md`;
  await fake.enqueue([
    {
      tool_calls: [
        {
          id: 't1',
          name: 'todoWrite',
          input: {
            todos: [
              { id: '1', content: 'write uart.c', status: 'in_progress' },
              { id: '2', content: 'call it', status: 'pending' },
            ],
          },
        },
        {
          id: 'p1',
          name: 'write_file',
          input: { path: planPath, content: '1. Add uart_init() to src/uart.c\n2. Call it from main()\n' },
        },
        { id: 's1', name: 'submitPlan', input: {} },
      ],
    },
    { chunks: ['carrying it out'] },
  ]);
  const st = new lib.SessionStream(client, s.id);
  const f = follow(st);
  st.start();
  await waitFor(() => st.state === 'open', 'open');
  const turnId = st.sendMessage('add a UART driver');
  await f.until((m) => m.plan !== null, 'the plan');
  assert.deepEqual(
    f.model.todos.map((x) => `${x.status}:${x.content}`),
    ['in_progress:write uart.c', 'pending:call it'],
  );
  assert.equal(f.model.plan.path, planPath);
  assert.equal(f.model.plan.callId, 's1');
  const edited = '1. Add uart_init() to src/uart.c with DMA\n2. Call it from main() before the banner\n';
  st.decidePlan(f.model.plan.planId, { approve: true, editedPlan: edited });
  await f.until(turnDone(turnId));
  assert.equal(f.model.plan, null);
  assert.equal(f.model.mode, 'act');
  assert.equal(f.model.lastResolution.summary, 'approved as edited');
  assert.equal(fs.readFileSync(path.join(d.project, planPath), 'utf8'), edited);
  assert.match(f.model.calls.get('s1').result, /as edited by the user/);
  const reqs = await fake.requests();
  assert.match(JSON.stringify(reqs[reqs.length - 1].body), /with DMA/);
  st.close();
});

test('the stream resumes from its last seq after it breaks mid-turn: nothing lost, nothing twice', async (t) => {
  const d = new Daemon(fake);
  t.after(() => d.cleanup());
  await d.start();
  await fake.reset();
  const client = await connect(d);
  t.after(() => client.close());
  const s = await createSession(client, d);
  const chunks = Array.from({ length: 60 }, (_, i) => `c${i} `);
  await fake.enqueue([{ chunks, chunk_delay_ms: 10 }]);
  const st = new lib.SessionStream(client, s.id, { minBackoffMs: 20 });
  const f = follow(st);
  st.start();
  await waitFor(() => st.state === 'open', 'open');
  const turnId = st.sendMessage('stream');
  await f.until((m) => m.events > 0 && f.seen.filter((e) => e.payload === 'text_delta').length >= 10, 'ten deltas');
  st.call.cancel(); // the connection breaks (as a network drop would)
  await f.until(turnDone(turnId));
  assert.ok(st.reconnects >= 1);
  const text = f.model.turnById.get(turnId).items[0].text;
  assert.equal(text, chunks.join(''));
  const stored = await storedEvents(client, s.id);
  assert.deepEqual(
    f.seen.map((e) => e.seq),
    stored.map((e) => e.seq),
  );
  st.close();
});

test('after the daemon restarts the stream reconnects by itself and the next turn streams', async (t) => {
  const d = new Daemon(fake);
  t.after(() => d.cleanup());
  await d.start();
  await fake.reset();
  const client = await connect(d);
  t.after(() => client.close());
  const s = await createSession(client, d);
  await fake.enqueue([{ chunks: ['before'] }]);
  const st = new lib.SessionStream(client, s.id, { minBackoffMs: 20, maxBackoffMs: 200 });
  t.after(() => st.close()); // a failure must not leave it reconnecting (and the run waiting) for ever
  const f = follow(st);
  const states = [];
  st.on('state', (x) => states.push(x));
  st.start();
  await waitFor(() => st.state === 'open', 'open');
  const t1 = st.sendMessage('one');
  await f.until(turnDone(t1));
  await d.stop('SIGTERM');
  await waitFor(() => st.state === 'reconnecting', 'the stream to notice');
  await d.start();
  await waitFor(() => st.state === 'open', 'the stream to reopen', 20000);
  await fake.enqueue([{ chunks: ['after'] }]);
  // Open means fwaid has accepted the reopened stream: the message is not lost.
  const t2 = st.sendMessage('two');
  await f.until(turnDone(t2));
  assert.match(f.model.outline(t2), /text\(main\): after/);
  assert.ok(states.includes('reconnecting'));
  const stored = await storedEvents(client, s.id);
  assert.deepEqual(
    f.seen.map((e) => e.seq),
    stored.map((e) => e.seq),
  );
  st.close();
});

test('a session started from the CLI shows its history and then its live tail', async (t) => {
  const d = new Daemon(fake);
  t.after(() => d.cleanup());
  await d.start();
  await fake.reset();
  await fake.enqueue([{ match: 'from the terminal', chunks: ['terminal answer'] }]);
  d.cli(['chat', 'from the terminal']);
  const client = await connect(d);
  t.after(() => client.close());
  const list = await client.call('Sessions', 'List', {});
  const s = list.sessions.find((x) => x.title === 'from the terminal');
  assert.ok(s, JSON.stringify(list.sessions.map((x) => x.title)));
  const st = new lib.SessionStream(client, s.id);
  const f = follow(st);
  st.start();
  await f.until((m, ev) => ev.payload === 'turn_finished', 'the history');
  assert.equal(f.model.turns[0].userText, 'from the terminal');
  assert.match(f.model.outline(), /terminal answer/);
  // The terminal goes on; its turn shows up live.
  await fake.enqueue([{ chunks: ['second from the cli'] }]);
  d.cli(['chat', '--session', s.id, 'again']);
  await f.until((m) => m.turns.length === 2 && !m.turns[1].running, 'the live turn');
  assert.match(f.model.outline(f.model.turns[1].id), /second from the cli/);
  st.close();
});

test('an unknown session is a clear, final error (no reconnect loop)', async (t) => {
  const d = new Daemon(fake);
  t.after(() => d.cleanup());
  await d.start();
  const client = await connect(d);
  t.after(() => client.close());
  const st = new lib.SessionStream(client, 's-nope');
  const fatal = new Promise((resolve) => st.on('fatal', resolve));
  st.start();
  const err = await fatal;
  assert.equal(err.codeName, 'NOT_FOUND');
  assert.match(err.message, /s-nope/);
  assert.equal(st.state, 'closed');
});
