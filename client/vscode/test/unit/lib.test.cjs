// Pure parts of the client library: addresses, the session tree, edits, file
// references, diagnostics.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const lib = require('../../out/client.js');

test('daemon addresses resolve like the CLI, plus tls:', () => {
  const env = { XDG_RUNTIME_DIR: '/run/user/1000' };
  assert.deepEqual(lib.resolveDaemonAddress('', env), {
    kind: 'unix',
    path: '/run/user/1000/fwai/fwaid.sock',
    isDefault: true,
    target: 'unix:/run/user/1000/fwai/fwaid.sock',
  });
  assert.equal(lib.resolveDaemonAddress('', { ...env, FWAI_DAEMON: 'unix:/tmp/x.sock' }).path, '/tmp/x.sock');
  assert.equal(lib.resolveDaemonAddress('/tmp/y.sock', env).isDefault, false);
  assert.equal(lib.resolveDaemonAddress('tcp:127.0.0.1:7447', env).target, '127.0.0.1:7447');
  assert.equal(lib.resolveDaemonAddress('localhost:7447', env).kind, 'tcp');
  const tls = lib.resolveDaemonAddress('tls:lab.example:7448', env);
  assert.deepEqual([tls.kind, tls.host, tls.port, tls.target], ['tls', 'lab.example', 7448, 'lab.example:7448']);
  assert.equal(lib.resolveDaemonAddress('tls:[::1]:7448', env).target, '[::1]:7448');
  assert.throws(() => lib.resolveDaemonAddress('lab.example', env), /daemon address 'lab.example': expected unix:PATH/);
  assert.throws(() => lib.resolveDaemonAddress('tls:lab.example', env), /expected HOST:PORT/);
  assert.throws(() => lib.resolveDaemonAddress('tcp:h:99999', env), /out of range/);
  assert.match(lib.defaultSocketPath({}), /^\/tmp\/fwai-\d+\/fwaid\.sock$/);
});

test("a board's stream choices: the UART first, then its RTT channels as the firmware names them", () => {
  assert.deepEqual(
    lib.streamChoices({ id: 'b', streams: [] }).map((c) => c.stream),
    ['uart'],
  );
  const c = lib.streamChoices({
    id: 'b',
    streams: [
      { id: 'uart', name: '' },
      { id: 'rtt:0', name: 'Terminal' },
      { id: 'rtt:1', name: '' },
      { id: 'semihosting', name: '' },
      { id: 'swo', name: 'from a newer fwaid' },
    ],
  });
  assert.deepEqual(
    c.map((x) => [x.stream, x.label]),
    [
      ['uart', 'UART'],
      ['rtt:0', 'RTT 0 · Terminal'],
      ['rtt:1', 'RTT 1'],
      ['semihosting', 'Semihosting'],
    ],
  );
});

let seq = 0;
const ev = (turn_id, payload, body) => ({
  session_id: 's',
  seq: ++seq,
  time_us: seq * 1000,
  turn_id,
  payload,
  [payload]: body,
});

test('the model nests sub-agent text and calls under the delegating call, to any depth', () => {
  seq = 0;
  const m = new lib.SessionModel('s');
  const evs = [
    ev('t1', 'user_message', { text: 'hi', sender: 'uid:1' }),
    ev('t1', 'turn_started', { provider: 'anthropic', model: 'm' }),
    ev('t1', 'text_delta', { origin: { agent: 'main', parent_call_id: '' }, text: 'Let me ' }),
    ev('t1', 'text_delta', { origin: { agent: 'main', parent_call_id: '' }, text: 'look.' }),
    ev('t1', 'tool_call_started', {
      call_id: 'd1',
      parent_call_id: '',
      agent: 'main',
      tool: 'delegateSubagent',
      input_json: '{}',
    }),
    ev('t1', 'tool_call_started', {
      call_id: 'd2',
      parent_call_id: 'd1',
      agent: 'lead',
      tool: 'delegateSubagent',
      input_json: '{}',
    }),
    ev('t1', 'tool_call_started', {
      call_id: 'g1',
      parent_call_id: 'd2',
      agent: 'codebase-explorer',
      tool: 'grep',
      input_json: '{"pattern":"x"}',
    }),
    ev('t1', 'tool_call_output_delta', { call_id: 'g1', text: 'a.c:1: x\n' }),
    ev('t1', 'tool_call_finished', { call_id: 'g1', is_error: false, output: 'a.c:1: x', duration_ms: 3 }),
    ev('t1', 'text_delta', { origin: { agent: 'codebase-explorer', parent_call_id: 'd2' }, text: 'found' }),
    ev('t1', 'tool_call_finished', { call_id: 'd2', is_error: false, output: 'found', duration_ms: 9 }),
    ev('t1', 'tool_call_started', {
      call_id: 'b1',
      parent_call_id: 'd1',
      agent: 'lead',
      tool: 'bash',
      input_json: '{}',
    }),
    ev('t1', 'tool_call_finished', { call_id: 'd1', is_error: false, output: 'ok', duration_ms: 20 }),
    ev('t1', 'text_delta', { origin: { agent: 'main', parent_call_id: '' }, text: 'Done.' }),
    ev('t1', 'turn_finished', {
      usage: { input_tokens: 10, output_tokens: 5, cost_usd: 0.25 },
      stop_reason: 'cancelled',
      iterations: 2,
      duration_ms: 1500,
    }),
  ];
  for (const e of evs) m.apply(e);
  assert.equal(
    m.outline('t1'),
    [
      'text(main): Let me look.',
      'delegateSubagent(main) [ok]',
      '  delegateSubagent(lead) [ok]',
      '    grep(codebase-explorer) [ok]',
      '    text(codebase-explorer): found',
      '  bash(lead) [error]',
      'text(main): Done.',
    ].join('\n'),
  );
  assert.equal(m.calls.get('g1').output, 'a.c:1: x\n');
  assert.equal(m.calls.get('b1').result, '(cancelled)'); // left running by a cancelled turn
  assert.equal(m.usage.cost_usd, 0.25);
  assert.equal(m.running, false);
  // Replayed events change nothing.
  const before = m.outline('t1');
  for (const e of evs) assert.deepEqual(m.apply(e), []);
  assert.equal(m.outline('t1'), before);
  assert.equal(lib.formatDuration(1500), '1.5 s');
  assert.equal(lib.formatCost(0.25), '$0.2500');
});

test('a call whose parent was never seen (attached mid-turn) goes at the top of its turn', () => {
  seq = 100;
  const m = new lib.SessionModel('s');
  m.apply(
    ev('t9', 'tool_call_started', {
      call_id: 'x',
      parent_call_id: 'unknown',
      agent: 'codebase-explorer',
      tool: 'read_file',
      input_json: '{}',
    }),
  );
  assert.equal(m.outline('t9'), 'read_file(codebase-explorer) [running]');
});

test('a board notice between turns is said under the latest turn; before any turn it is dropped', () => {
  seq = 150;
  const m = new lib.SessionModel('s');
  const notice = { board: 'b1', rule: 'hardfault', text: "watch 'hardfault' fired on b1: FAULT" };
  assert.deepEqual(m.apply(ev('', 'board_notice', notice)), []);
  m.apply(ev('t1', 'user_message', { text: 'hi', sender: 'uid:1' }));
  m.apply(ev('t1', 'turn_finished', { stop_reason: 'end_turn', duration_ms: 1 }));
  const changes = m.apply(ev('', 'board_notice', notice));
  assert.equal(changes.length, 1);
  assert.equal(changes[0].turnId, 't1');
  assert.equal(m.outline('t1'), "info: [b1] watch 'hardfault' fired on b1: FAULT");
});

test('question and plan state follow asked / answered / decided / finished', () => {
  seq = 200;
  const m = new lib.SessionModel('s');
  m.apply(
    ev('t1', 'question_asked', {
      question_id: 'q1',
      call_id: 'c1',
      questions: [{ id: 'q1.1', text: 'Which?', options: [], multiple: false, allow_free_text: true }],
    }),
  );
  assert.equal(m.question.questionId, 'q1');
  m.apply(
    ev('t1', 'question_answered', {
      question_id: 'q1',
      selected: [],
      text: 'USART2',
      answered_by: 'alice via fwai',
      call_id: 'c1',
    }),
  );
  assert.equal(m.question, null);
  assert.deepEqual(m.lastResolution, {
    kind: 'question',
    id: 'q1',
    by: 'alice via fwai',
    user: '',
    timeUs: seq * 1000,
    summary: 'USART2',
  });
  m.apply(ev('t1', 'plan_submitted', { plan_id: 'p1', text: 'plan', path: '.fwai/plans/s.md', call_id: 'c2' }));
  assert.equal(m.plan.planId, 'p1');
  m.apply(ev('t1', 'tool_call_finished', { call_id: 'c2', is_error: true, output: 'cancelled', duration_ms: 1 }));
  assert.equal(m.plan, null); // an older daemon without plan_decided: the call's end closes it
  m.apply(ev('t1', 'plan_submitted', { plan_id: 'p2', text: 'plan', path: 'x', call_id: 'c3' }));
  m.apply(
    ev('t1', 'plan_decided', { plan_id: 'p2', approved: false, edited: false, feedback: 'use DMA', decided_by: 'bob' }),
  );
  assert.equal(m.lastResolution.summary, 'sent back: use DMA');
  m.apply(ev('', 'mode_changed', { mode: 'plan', reason: 'set' }));
  assert.equal(m.mode, 'plan');
});

test('a decision reads "approved by alice, 10:42": the person and the time, not the client', () => {
  seq = 300;
  const m = new lib.SessionModel('s');
  const at = new Date(2026, 10, 30, 10, 42, 17);
  m.apply(ev('t1', 'plan_submitted', { plan_id: 'p1', text: 'plan', path: 'x', call_id: 'c1' }));
  m.apply({
    ...ev('t1', 'plan_decided', {
      plan_id: 'p1',
      approved: true,
      edited: true,
      decided_by: 'alice (uid 1000) via vscode 1.100.3 pid 4242',
      decided_by_user: 'alice',
    }),
    time_us: at.getTime() * 1000,
  });
  assert.equal(lib.resolutionLine(m.lastResolution), 'Plan approved as edited by alice, 10:42');
  // An older daemon names no user: the name before the client's details.
  m.apply({
    ...ev('t1', 'question_answered', { question_id: 'q', text: 'yes', answered_by: 'bob (uid 1001) via fwai 0.9' }),
    time_us: new Date(2026, 10, 30, 9, 5).getTime() * 1000,
  });
  assert.equal(lib.resolutionLine(m.lastResolution), 'Question yes by bob, 09:05');
  // An edit's accept says which edit.
  m.apply(
    ev('t1', 'question_asked', {
      question_id: 'qe',
      call_id: 'e1',
      questions: [],
      edit: { call_id: 'e1', tool: 'edit_file', path: 'src/main.c', preview: '' },
    }),
  );
  m.apply({
    ...ev('t1', 'question_answered', {
      question_id: 'qe',
      selected: ['Reject'],
      text: 'not now',
      answered_by: 'alice (uid 1000) via vscode',
      answered_by_user: 'alice',
    }),
    time_us: new Date(2026, 10, 30, 11, 7).getTime() * 1000,
  });
  assert.equal(lib.resolutionLine(m.lastResolution), 'edit_file src/main.c rejected: not now by alice, 11:07');
});

test("a shared session names each message's author from the first guest on, and who cancelled or switched", () => {
  seq = 350;
  const m = new lib.SessionModel('s');
  const alice = { principal: 'uid:1000', user: 'alice', owner: true };
  const bob = { principal: 'user:bob', user: 'bob', owner: false };
  m.apply(ev('t1', 'user_message', { text: 'blink faster', sender: 'alice (uid 1000) via fwai', author: alice }));
  assert.equal(m.shared, false, 'only the owner so far: nothing to tell apart');
  assert.equal(m.turnById.get('t1').author, 'alice');
  m.apply(ev('t1', 'turn_finished', { stop_reason: 'end_turn', duration_ms: 5 }));
  const changes = m.apply(ev('t2', 'user_message', { text: 'and log it', sender: 'bob via vscode', author: bob }));
  assert.equal(m.shared, true);
  const t2 = m.turnById.get('t2');
  assert.deepEqual([t2.author, t2.authorIsOwner], ['bob', false]);
  // The owner's earlier turn is redrawn to show its author too.
  assert.ok(changes.some((c) => c.type === 'turn' && c.turnId === 't1' && !c.added));
  m.apply(ev('t2', 'mode_changed', { mode: 'plan', reason: 'set by bob', author: bob }));
  assert.match(m.outline(), /bob switched to plan mode/);
  m.apply(ev('t2', 'turn_finished', { stop_reason: 'cancelled', duration_ms: 9, cancelled_by: alice }));
  assert.equal(t2.cancelledBy, 'alice');
  // The verified author names the decider, even where an older field says otherwise.
  m.apply(ev('t2', 'plan_submitted', { plan_id: 'p9', text: 'plan', path: 'x', call_id: 'c9' }));
  m.apply(
    ev('t2', 'plan_decided', { plan_id: 'p9', approved: true, decided_by: 'x', decided_by_user: '', author: bob }),
  );
  assert.match(lib.resolutionLine(m.lastResolution), /^Plan approved by bob/);
});

test("a sub-agent's answer shows once: as its text, not again as the delegating call's result", () => {
  seq = 400;
  const m = new lib.SessionModel('s');
  const sub = { agent: 'codebase-explorer', parent_call_id: 'd1' };
  m.apply(ev('t1', 'turn_started', { provider: 'fake', model: 'm' }));
  m.apply(ev('t1', 'tool_call_started', { call_id: 'd1', tool: 'delegateSubagent', agent: 'main', input_json: '{}' }));
  m.apply(ev('t1', 'text_delta', { text: 'counter is 42 ', origin: sub }));
  m.apply(ev('t1', 'text_delta', { text: 'in main.c:1', origin: sub }));
  m.apply(ev('t1', 'tool_call_finished', { call_id: 'd1', output: 'counter is 42 in main.c:1', duration_ms: 5 }));
  const d1 = m.calls.get('d1');
  assert.equal(d1.result, 'counter is 42 in main.c:1');
  assert.equal(lib.shownResult(d1), '');
  // A result the text does not hold (an error, or no text streamed) is shown.
  m.apply(ev('t1', 'tool_call_started', { call_id: 'd2', tool: 'delegateSubagent', agent: 'main', input_json: '{}' }));
  m.apply(
    ev('t1', 'tool_call_finished', { call_id: 'd2', output: 'the sub-agent hit its step limit', duration_ms: 5 }),
  );
  assert.equal(lib.shownResult(m.calls.get('d2')), 'the sub-agent hit its step limit');
  m.apply(ev('t1', 'tool_call_started', { call_id: 'r1', tool: 'read_file', agent: 'main', input_json: '{}' }));
  m.apply(ev('t1', 'tool_call_finished', { call_id: 'r1', output: 'int x;', duration_ms: 1 }));
  assert.equal(lib.shownResult(m.calls.get('r1')), 'int x;');
});

test('an edit_file change is undone on the current text to show what it changed', () => {
  const c = lib.fileChangeOf(
    'edit_file',
    JSON.stringify({ path: 'src/main.c', old_string: 'int x = 1;', new_string: 'int x = 2;' }),
    'edited src/main.c (1 replacement)\n--- a/src/main.c\n+++ b/src/main.c\n@@ -3,1 +3,1 @@\n-int x = 1;\n+int x = 2;\n',
    'e1',
  );
  assert.equal(c.path, 'src/main.c');
  assert.equal(c.line, 3);
  assert.equal(lib.textBeforeEdit(c, 'a\nb\nint x = 2;\nc\n'), 'a\nb\nint x = 1;\nc\n');
  assert.equal(lib.textBeforeEdit(c, 'changed since\n'), null);
  // Two copies now: the one nearest the recorded line is put back.
  assert.equal(lib.textBeforeEdit(c, 'int x = 2;\nb\nint x = 2;\n'), 'int x = 2;\nb\nint x = 1;\n');
  const all = lib.fileChangeOf(
    'edit_file',
    JSON.stringify({ path: 'a', old_string: 'u8', new_string: 'uint8_t', replace_all: true }),
    'edited a',
    'e2',
  );
  assert.equal(lib.textBeforeEdit(all, 'uint8_t a; uint8_t b;'), 'u8 a; u8 b;');
  const w = lib.fileChangeOf(
    'write_file',
    JSON.stringify({ path: 'n.c', content: 'x' }),
    'created n.c (1 bytes, 1 lines)',
    'w1',
  );
  assert.equal(w.created, true);
  assert.equal(lib.fileChangeOf('write_file', '{"path":"n.c"}', 'refused', 'w2', true), null);
  assert.equal(lib.fileChangeOf('read_file', '{"path":"n.c"}', '', 'r'), null);
});

test('file:line references in tool output and compiler messages', () => {
  const text =
    'src/main.c:42:7: error: x\n  in ./drivers/uart.h:9 and Core/Src/stm32f1xx_it.c(120): warning\nnot a ref: 10:30 or v1.2:3';
  assert.deepEqual(
    lib.findFileRefs(text).map((r) => [r.path, r.line, r.column]),
    [
      ['src/main.c', 42, 7],
      ['./drivers/uart.h', 9, 0],
      ['Core/Src/stm32f1xx_it.c', 120, 0],
    ],
  );
});

test('typed diagnostics from skill events', () => {
  const d = lib.diagnosticOf({
    run_id: 'r',
    step: 'build',
    kind: 'diagnostic',
    text: '',
    ok: false,
    json: JSON.stringify({
      kind: 'compiler',
      severity: 'error',
      message: "'x' undeclared",
      file: 'src/main.c',
      line: 5,
      column: 3,
    }),
  });
  assert.deepEqual(d, {
    file: 'src/main.c',
    line: 5,
    column: 3,
    severity: 'error',
    message: "'x' undeclared",
    kind: 'compiler',
    step: 'build',
  });
  const r = lib.diagnosticOf({
    run_id: 'r',
    step: 'build',
    kind: 'diagnostic',
    text: '',
    ok: false,
    json: JSON.stringify({
      kind: 'region_overflow',
      severity: 'error',
      message: "region `FLASH' overflowed",
      region: 'FLASH',
      bytes: 120,
    }),
  });
  assert.equal(r.message, "region `FLASH' overflowed (region FLASH, 120 bytes)");
  assert.equal(lib.diagnosticOf({ kind: 'output', json: '' }), null);
});

test("a turn's hunks: 0-based starts for changes, insertions and deletions, CRLF lines bare", () => {
  const { hunksOf } = lib;
  assert.deepEqual(hunksOf('a\nb\nc\n', 'a\nc\n'), [{ oldStart: 1, oldLines: ['b'], newStart: 1, newLines: [] }]);
  assert.deepEqual(hunksOf('a\nc\n', 'a\nb\nc\n'), [{ oldStart: 1, oldLines: [], newStart: 1, newLines: ['b'] }]);
  assert.deepEqual(hunksOf('a\nb\nc\n', 'a\nB\nc\n'), [{ oldStart: 1, oldLines: ['b'], newStart: 1, newLines: ['B'] }]);
  assert.deepEqual(hunksOf('a\r\nb\r\n', 'a\r\nB\r\n'), [
    { oldStart: 1, oldLines: ['b'], newStart: 1, newLines: ['B'] },
  ]);
  assert.deepEqual(hunksOf('a\n', ''), [{ oldStart: 0, oldLines: ['a'], newStart: 0, newLines: [] }]);
});

test('a hunk reverted alone: the others stay; line ends and a missing last newline kept', () => {
  const { hunksOf, withHunkReverted } = lib;
  const one = (before, now, i) => withHunkReverted(before, now, hunksOf(before, now)[i]);
  assert.equal(one('a\nb\nc\n', 'A\nb\nC\n', 0), 'a\nb\nC\n');
  assert.equal(one('a\nb\nc\n', 'A\nb\nC\n', 1), 'A\nb\nc\n');
  assert.equal(one('a\nb\nc', 'a\nb\nC', 0), 'a\nb\nc');
  assert.equal(one('a\nb\nc\n', 'a\nb\nc', 0), 'a\nb\nc\n');
  assert.equal(one('a\nb\nc', 'a\nb\nc\n', 0), 'a\nb\nc');
  assert.equal(one('', 'x\n', 0), '');
  assert.equal(one('x\n', '', 0), 'x\n');
  assert.equal(one('a\r\nb\r\nc\r\n', 'a\r\nB\r\nc\r\nd\r\n', 0), 'a\r\nb\r\nc\r\nd\r\n');
  assert.equal(one('a\r\nb\r\nc\r\n', 'a\r\nB\r\nc\r\nd\r\n', 1), 'a\r\nB\r\nc\r\n');
  assert.equal(one('1\n2\n3\n', '0\n1\n2\n3\n4\n', 1), '0\n1\n2\n3\n');
  // A hunk of some other pair of texts is refused, not applied somewhere.
  assert.throws(
    () => withHunkReverted('a\n', 'b\n', { oldStart: 5, oldLines: ['x'], newStart: 5, newLines: ['y'] }),
    /no longer in the file/,
  );
});

test("the chat's outbox joins a stream's waiting text deltas, and nothing else", () => {
  const { EventOutbox } = lib;
  const delta = (seq, text, extra = {}) => ({
    session_id: 's',
    seq,
    time_us: seq * 1000,
    turn_id: extra.turn ?? 't1',
    payload: 'text_delta',
    text_delta: {
      origin: { agent: extra.agent ?? 'main', parent_call_id: extra.parent ?? '' },
      text,
      thinking: !!extra.thinking,
    },
  });
  const o = new EventOutbox();
  o.push(delta(1, 'Hel'), 5);
  o.push(delta(2, 'lo'), 6);
  o.push(delta(3, 'hmm', { thinking: true }), 7); // thinking is its own stream
  o.push(delta(4, 'sub', { agent: 'codebase-explorer', parent: 'd1' }), 8); // so is a sub-agent
  o.push({
    session_id: 's',
    seq: 5,
    time_us: 5000,
    turn_id: 't1',
    payload: 'tool_call_started',
    tool_call_started: {},
  });
  o.push(delta(6, ' world'), 9); // a tool call between: kept apart, in order
  o.push(delta(7, '!', { turn: 't2' })); // another turn
  assert.equal(o.size, 6);
  const out = o.take();
  assert.equal(o.size, 0);
  assert.deepEqual(
    out.map((x) => [x.ev.seq, x.ev.payload, x.ev.text_delta?.text]),
    [
      [2, 'text_delta', 'Hello'],
      [3, 'text_delta', 'hmm'],
      [4, 'text_delta', 'sub'],
      [5, 'tool_call_started', undefined],
      [6, 'text_delta', ' world'],
      [7, 'text_delta', '!'],
    ],
  );
  // The first delta's time stays the event's; each joined delta's times kept for measurements.
  assert.equal(out[0].ev.time_us, 1000);
  assert.deepEqual(out[0].perf, [
    [1000, 5],
    [2000, 6],
  ]);
  assert.deepEqual(out[5].perf, []);
  // What a model makes of the joined events equals what it makes of each one.
  const { SessionModel } = lib;
  const a = new SessionModel('s');
  const b = new SessionModel('s');
  const evs = [delta(1, 'Hel'), delta(2, 'lo'), delta(3, ' there')];
  for (const e of evs) a.apply(e);
  const o2 = new EventOutbox();
  for (const e of evs) o2.push(e);
  for (const x of o2.take()) b.apply(x.ev);
  assert.equal(b.turns[0].items[0].text, 'Hello there');
  assert.deepEqual(JSON.stringify(b.turns), JSON.stringify(a.turns));
  assert.equal(b.lastSeq, 3);
});
