// The client library's named calls (what the extension's views and commands
// use instead of raw RPCs) against a real fwaid: the daemon's status,
// sessions, skills, the project's configuration, boards and leases, and the
// evidence log; an unknown id or a bad argument is an error that names it.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { Daemon, PROTO_ROOT, ROOT } = require('../support/fixtures.cjs');
const lib = require('../../out/client.js');

async function start(t) {
  const d = new Daemon(null);
  t.after(() => d.cleanup());
  await d.start();
  const client = await lib.FwaiClient.connect({ address: d.address, protoRoot: PROTO_ROOT, clientName: 'vscode-test' });
  t.after(() => client.close());
  return { d, client };
}

/** Rejects with a FwaiError of `codeName` whose message matches `re`. */
function failsWith(p, codeName, re) {
  return assert.rejects(p, (e) => {
    assert.ok(e instanceof lib.FwaiError, `not a FwaiError: ${e}`);
    assert.equal(e.codeName, codeName, e.message);
    assert.match(e.message, re);
    return true;
  });
}

test('daemon status, sessions created, listed, read and deleted; unknown ids and bad roots are named', async (t) => {
  const { d, client } = await start(t);

  const st = await lib.daemonStatus(client);
  assert.equal(st.pid, d.proc.pid);
  assert.ok(st.started_us > 0 && st.started_us <= Date.now() * 1000);
  assert.deepEqual(st.listen, [d.address]);
  assert.equal(st.caller, `uid:${process.getuid()}`);
  assert.equal(lib.callerUid(st), String(process.getuid()));
  assert.equal(lib.callerUid({ caller: 'user:alice' }), '');

  const a = await lib.createSession(client, { projectRoot: d.project, title: 'first', mode: 'plan' });
  assert.match(a.id, /^s-/);
  assert.deepEqual(
    [a.title, a.project_root, a.mode, a.turn_running, a.last_seq],
    ['first', d.project, 'plan', false, 0],
  );
  const b = await lib.createSession(client, { projectRoot: d.project, title: 'second' });
  assert.equal(b.mode, 'act');
  assert.notEqual(b.id, a.id);

  const got = await lib.getSession(client, a.id);
  assert.deepEqual([got.id, got.title, got.mode, got.owner], [a.id, 'first', 'plan', `uid:${process.getuid()}`]);

  const listed = await lib.listSessions(client);
  assert.deepEqual(listed.map((s) => s.id).sort(), [a.id, b.id].sort());
  for (let i = 1; i < listed.length; i++) assert.ok(listed[i - 1].updated_us >= listed[i].updated_us, 'newest first');

  await lib.deleteSession(client, a.id);
  assert.deepEqual(
    (await lib.listSessions(client)).map((s) => s.id),
    [b.id],
  );
  await failsWith(lib.getSession(client, a.id), 'NOT_FOUND', new RegExp(`session ${a.id} not found`));
  await failsWith(lib.deleteSession(client, a.id), 'NOT_FOUND', new RegExp(a.id));
  await failsWith(lib.getSession(client, 's-nope'), 'NOT_FOUND', /session s-nope not found/);
  await failsWith(
    lib.createSession(client, { projectRoot: 'relative/dir' }),
    'INVALID_ARGUMENT',
    /'relative\/dir' is not an absolute path/,
  );
});

test("a project's skills and configuration; a missing project or config is named", async (t) => {
  const { d, client } = await start(t);

  const skills = await lib.listSkills(client, d.project);
  const byName = new Map(skills.map((s) => [s.name, s]));
  assert.ok(byName.has('build') && byName.has('flash'), JSON.stringify([...byName.keys()]));
  assert.equal(byName.get('build').builtin, true);
  assert.equal(byName.get('build').flashes, false);
  assert.equal(byName.get('flash').flashes, true);
  assert.ok(byName.get('build').steps.length > 0);
  await failsWith(lib.listSkills(client, '/nonexistent/project'), 'INVALID_ARGUMENT', /is not a directory/);

  await failsWith(lib.getProjectConfig(client, d.project), 'NOT_FOUND', /project\.yaml does not exist/);
  const example = path.join(ROOT, 'examples', 'stm32vl-blinky', '.fwai', 'project.yaml');
  fs.mkdirSync(path.join(d.project, '.fwai'));
  fs.copyFileSync(example, path.join(d.project, '.fwai', 'project.yaml'));
  const yaml = await lib.getProjectConfig(client, d.project);
  assert.equal(yaml, fs.readFileSync(example, 'utf8'));
  assert.equal(lib.configuredImage(yaml), 'build/blinky.elf');
  assert.equal(lib.configuredImage('name: x\nflash:\n  command: fwai flash\n'), '');
  assert.equal(lib.configuredImage('flash:\n  image: "out/app.elf"  # the app\n'), 'out/app.elf');
});

test('boards: listed, leased, renewed and released; a failed self-test marks the board bad; unknown ids are named', async (t) => {
  const { client } = await start(t);

  const before = await lib.listDevices(client);
  const sim = before.devices.find((x) => x.id === 'sim-stm32vl');
  assert.ok(sim, JSON.stringify(before.devices.map((x) => x.id)));
  assert.deepEqual([sim.kind, sim.health, sim.holder], ['simulated', 'good', '']);
  assert.deepEqual(before.leases, []);

  const lease = await lib.acquireLease(client, 'sim-stm32vl', { ttlS: 60 });
  assert.equal(lease.device_id, 'sim-stm32vl');
  assert.equal(lease.ttl_s, 60);
  assert.match(lease.lease_id, /\S/);
  assert.match(lease.holder, /via vscode-test/);
  assert.ok(Math.abs(lease.expires_us - lease.acquired_us - 60e6) < 1e6, JSON.stringify(lease));

  const held = await lib.listDevices(client);
  assert.deepEqual(
    held.leases.map((l) => [l.lease_id, l.device_id]),
    [[lease.lease_id, 'sim-stm32vl']],
  );
  assert.equal(held.devices.find((x) => x.id === 'sim-stm32vl').holder, lease.holder);

  const renewed = await lib.renewLease(client, lease.lease_id);
  assert.equal(renewed.lease_id, lease.lease_id);
  assert.ok(renewed.expires_us >= lease.expires_us);

  await lib.releaseLease(client, { leaseId: lease.lease_id });
  const after = await lib.listDevices(client);
  assert.deepEqual(after.leases, []);
  assert.equal(after.devices.find((x) => x.id === 'sim-stm32vl').holder, '');
  await failsWith(lib.renewLease(client, lease.lease_id), 'NOT_FOUND', /no such lease/);
  await failsWith(lib.releaseLease(client, { leaseId: lease.lease_id }), 'NOT_FOUND', /no such lease/);
  // Released by the board's id: the caller's lease on it.
  const again = await lib.acquireLease(client, 'sim-stm32vl', { ttlS: 30 });
  assert.notEqual(again.lease_id, lease.lease_id);
  await lib.releaseLease(client, { deviceId: 'sim-stm32vl' });
  assert.deepEqual((await lib.listDevices(client)).leases, []);

  await failsWith(lib.acquireLease(client, 'no-such-board'), 'NOT_FOUND', /no board or device 'no-such-board'/);
  await failsWith(lib.selfTest(client, 'no-such-board'), 'NOT_FOUND', /no board 'no-such-board'/);
  // Nothing flashed: the self-test fails, says why, and the board is not handed out until it passes.
  await failsWith(lib.selfTest(client, 'sim-stm32vl'), 'FAILED_PRECONDITION', /no firmware to boot/);
  const bad = (await lib.listDevices(client)).devices.find((x) => x.id === 'sim-stm32vl');
  assert.equal(bad.health, 'bad');
  assert.match(bad.health_reason, /self-test failed: no firmware to boot/);
});

test('evidence: records newest first, one read by id, the log verified and exported; unknown runs and formats are named', async (t) => {
  const { d, client } = await start(t);
  const sessions = [];
  for (const title of ['one', 'two', 'three']) {
    sessions.push((await lib.createSession(client, { projectRoot: d.project, title })).id);
  }

  const runs = await lib.listEvidenceRuns(client);
  const created = runs.map((r) => JSON.parse(r.record_json)).filter((j) => j.kind === 'session_created');
  assert.deepEqual(
    created.map((j) => j.session_id),
    [...sessions].reverse(),
  );
  for (let i = 1; i < runs.length; i++) assert.ok(runs[i - 1].index > runs[i].index, 'newest first');
  assert.deepEqual(
    (await lib.listEvidenceRuns(client, 1)).map((r) => r.run_id),
    [runs[0].run_id],
  );

  const one = await lib.getEvidenceRun(client, runs[1].run_id);
  assert.deepEqual(one, runs[1]);
  assert.match(one.hash, /^[0-9a-f]{64}$/);

  const v = await lib.verifyEvidence(client);
  assert.equal(v.ok, true, v.detail);
  assert.equal(v.records, runs.length);
  assert.equal(v.first_bad, '');

  const sarif = await lib.exportEvidence(client, 'sarif');
  assert.equal(sarif.contentType, 'application/sarif+json');
  assert.equal(JSON.parse(sarif.data.toString('utf8')).version, '2.1.0');
  const html = (await lib.exportEvidence(client, 'html')).data.toString('utf8');
  assert.match(html, /<html/i);
  assert.ok(html.includes(sessions[2]), 'the report names the sessions');

  await failsWith(lib.getEvidenceRun(client, 'run-nope'), 'NOT_FOUND', /no run 'run-nope'/);
  await failsWith(lib.exportEvidence(client, 'pdf'), 'INVALID_ARGUMENT', /'pdf' \(expected json, csv, sarif, html/);
});
