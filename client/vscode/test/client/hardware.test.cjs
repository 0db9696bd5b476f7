// Boards through the client library against a real fwaid and a simulated
// STM32 board on QEMU: lease, a serial reader that stays open while the board
// is flashed (the daemon owns the port, so flashing does not take it away),
// the guard's refusal with its rule, commands over serial, release, and the
// self-test of the flashed board.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { BIN, Daemon, PROTO_ROOT, ROOT } = require('../support/fixtures.cjs');
const lib = require('../../out/client.js');

function buildBlinky(project) {
  fs.cpSync(path.join(ROOT, 'examples', 'stm32vl-blinky'), project, { recursive: true });
  fs.rmSync(path.join(project, '.fwai'), { recursive: true, force: true });
  execFileSync('make', ['-s', '-C', project], { stdio: 'pipe' });
  return path.join(project, 'build', 'blinky.elf');
}

function linesUntil(serial, re, ms = 20000) {
  return new Promise((resolve, reject) => {
    const got = [];
    const timer = setTimeout(
      () => reject(new Error(`no line matching ${re} in ${ms} ms; got: ${JSON.stringify(got)}`)),
      ms,
    );
    const on = (lines) => {
      for (const l of lines) {
        got.push(l.line);
        if (re.test(l.line)) {
          clearTimeout(timer);
          serial.off('lines', on);
          resolve({ line: l.line, got });
          return;
        }
      }
    };
    serial.on('lines', on);
  });
}

/** A fwaid with the example built in its project and a client connected to it, both ended after `t`. */
async function startWithExample(t) {
  const d = new Daemon(null);
  t.after(() => d.cleanup());
  await d.start();
  const elf = buildBlinky(d.project);
  const client = await lib.FwaiClient.connect({ address: d.address, protoRoot: PROTO_ROOT, clientName: 'vscode-test' });
  t.after(() => client.close());
  return { d, elf, client };
}

/** Flashes through the library; answers every progress message, the last being what flashImage resolved with. */
async function flash(client, o) {
  const progress = [];
  const last = await lib.flashImage(client, o, (p) => progress.push(p));
  assert.equal(last, progress[progress.length - 1]);
  return progress;
}

test(
  'lease, serial open across a flash, guard refusal with its rule, send a command, release',
  { timeout: 120000 },
  async (t) => {
    const { d, elf, client } = await startWithExample(t);

    const devs = await lib.listDevices(client);
    const board = devs.devices.find((x) => x.id === 'sim-stm32vl');
    assert.ok(board, JSON.stringify(devs.devices.map((x) => x.id)));
    assert.equal(board.health, 'good');

    // Without a lease the guard refuses and names its rule.
    await assert.rejects(
      flash(client, { deviceId: 'sim-stm32vl', imagePath: elf, approved: true, projectRoot: d.project }),
      (e) => /flash guard \(lease\)/.test(e.message),
    );

    const lease = await lib.acquireLease(client, 'sim-stm32vl', { ttlS: 60 });
    assert.equal(lease.device_id, 'sim-stm32vl');
    assert.ok(lease.expires_us > Date.now() * 1000);
    const renewed = await lib.renewLease(client, lease.lease_id);
    assert.ok(renewed.expires_us >= lease.expires_us);
    const held = (await lib.listDevices(client)).devices.find((x) => x.id === 'sim-stm32vl');
    assert.match(held.holder, /via vscode-test/);

    // Two terminals read the port from now on; the flash restarts the board under them.
    const s1 = new lib.SerialSession(client, 'sim-stm32vl', { leaseId: lease.lease_id });
    const s2 = new lib.SerialSession(client, 'sim-stm32vl');
    const opened = Promise.all([new Promise((r) => s1.once('opened', r)), new Promise((r) => s2.once('opened', r))]);
    await s1.open();
    await s2.open();
    await opened;
    const banner1 = linesUntil(s1, /stm32vl-blinky 1\.0\.0 booted/);
    const banner2 = linesUntil(s2, /stm32vl-blinky 1\.0\.0 booted/);
    const progress = await flash(client, {
      deviceId: 'sim-stm32vl',
      imagePath: elf,
      approved: true,
      leaseId: lease.lease_id,
      projectRoot: d.project,
    });
    const last = progress[progress.length - 1];
    assert.equal(last.done, true);
    assert.match(last.image_sha256, /^[0-9a-f]{64}$/);
    await Promise.all([banner1, banner2]);
    assert.equal(s1.isOpen, true);

    const pong = linesUntil(s2, /^pong$/);
    s1.sendLine('ping');
    await pong;

    // The firmware's RTT channels, as the listing names them, read and written like the UART.
    const listed = (await lib.listDevices(client)).devices.find((x) => x.id === 'sim-stm32vl');
    assert.deepEqual(
      lib.streamChoices(listed).map((c) => c.label),
      ['UART', 'RTT 0 · Terminal', 'RTT 1 · Trace'],
    );
    const rtt = new lib.SerialSession(client, 'sim-stm32vl', {
      stream: 'rtt:0',
      fromHistory: true,
      leaseId: lease.lease_id,
    });
    const rttOpened = new Promise((r) => rtt.once('opened', r));
    const rttBanner = linesUntil(rtt, /^rtt: stm32vl-blinky 1\.0\.0 booted$/);
    await rtt.open();
    await rttOpened;
    assert.equal(rtt.stream, 'rtt:0');
    await rttBanner;
    const rttPong = linesUntil(rtt, /^pong$/);
    rtt.sendLine('ping');
    await rttPong;
    rtt.close();
    const missing = new lib.SerialSession(client, 'sim-stm32vl', { stream: 'rtt:9' });
    const refused = new Promise((r) => missing.once('end', (reason) => r(reason)));
    await missing.open();
    assert.match(await refused, /RTT up-channels 0 to 1, not rtt:9/);

    // Release: the serial readers opened under the lease end with the reason.
    const ended = new Promise((r) => s1.once('end', (reason) => r(reason)));
    await lib.releaseLease(client, { leaseId: lease.lease_id });
    assert.match(await ended, /lease|released/i);
    s2.close();
    const after = (await lib.listDevices(client)).devices.find((x) => x.id === 'sim-stm32vl');
    assert.equal(after.holder, '');

    // With the image on it, the board passes its self-test.
    assert.match(await lib.selfTest(client, 'sim-stm32vl'), /booted: stm32vl-blinky 1\.0\.0 booted/);
    assert.equal((await lib.listDevices(client)).devices.find((x) => x.id === 'sim-stm32vl').health, 'good');
  },
);

function once(emitter, event, ms = 30000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no '${event}' in ${ms} ms`)), ms);
    emitter.once(event, (...args) => {
      clearTimeout(timer);
      resolve(args);
    });
  });
}

test(
  'a serial reader opened with reconnect survives fwaid stopping, being killed and restarting; a lease end still ends it',
  { timeout: 180000 },
  async (t) => {
    const { d, elf, client } = await startWithExample(t);
    const lease = await lib.acquireLease(client, 'sim-stm32vl', { ttlS: 600 });
    await flash(client, {
      deviceId: 'sim-stm32vl',
      imagePath: elf,
      approved: true,
      leaseId: lease.lease_id,
      projectRoot: d.project,
    });

    const opts = { reconnect: true, minBackoffMs: 50, maxBackoffMs: 500 };
    const reader = new lib.SerialSession(client, 'sim-stm32vl', opts);
    const typist = new lib.SerialSession(client, 'sim-stm32vl', { ...opts, leaseId: lease.lease_id });
    const ends = [];
    const breaks = [];
    reader.on('reconnecting', (r) => breaks.push(r));
    reader.on('end', (reason) => ends.push(`reader: ${reason}`));
    typist.on('end', (reason) => ends.push(`typist: ${reason}`));
    const opened = Promise.all([once(reader, 'opened'), once(typist, 'opened')]);
    await reader.open();
    await typist.open();
    await opened;

    for (const signal of ['SIGTERM', 'SIGKILL']) {
      const going = Promise.all([once(reader, 'reconnecting'), once(typist, 'reconnecting')]);
      const back = Promise.all([once(reader, 'reconnected', 60000), once(typist, 'reconnected', 60000)]);
      // The board boots its image again when fwaid starts; its banner reaches the reopened reader.
      const banner = linesUntil(reader, /stm32vl-blinky 1\.0\.0 booted/, 60000);
      await d.stop(signal);
      await going;
      await d.start();
      const [[restartedR], [restartedT]] = await back;
      assert.equal(restartedR, true, signal);
      assert.equal(restartedT, true, signal);
      await banner;
      assert.deepEqual(ends, [], signal);
      assert.equal(breaks.length, signal === 'SIGTERM' ? 1 : 2, JSON.stringify(breaks));
      // The lease outlived the restart: the reopened typist still talks to the board.
      const pong = linesUntil(reader, /^pong$/, 30000);
      typist.sendLine('ping');
      await pong;
    }

    // An end fwaid means is final: the lease is released, and the streams its holder opened end
    // with the reason instead of reconnecting.
    const ended = Promise.all([once(typist, 'end'), once(reader, 'end')]);
    const reconnects = reader.reconnects + typist.reconnects;
    await lib.releaseLease(client, { leaseId: lease.lease_id });
    const [[reasonT], [reasonR]] = await ended;
    assert.match(reasonT, /lease .* ended: released/);
    assert.match(reasonR, /lease .* ended: released/);
    assert.equal(typist.isOpen, false);
    assert.equal(reader.isOpen, false);
    assert.equal(reader.reconnects + typist.reconnects, reconnects);
    assert.equal(breaks.length, 2, JSON.stringify(breaks));
    assert.deepEqual(ends.sort(), [`reader: ${reasonR}`, `typist: ${reasonT}`]);

    // A reader closed by its user ends as 'closed'.
    const third = new lib.SerialSession(client, 'sim-stm32vl', opts);
    await third.open();
    await once(third, 'opened');
    const closed = once(third, 'end');
    third.close();
    assert.equal((await closed)[0], 'closed');
  },
);

test(
  'a faulted board captured through the library decodes offline into a report: fault, line, locals, serial',
  { timeout: 120000 },
  async (t) => {
    const { d, elf, client } = await startWithExample(t);
    // Nobody's lease: refused, naming why.
    await assert.rejects(lib.captureFault(client, 'sim-stm32vl'), /lease/);
    const lease = await lib.acquireLease(client, 'sim-stm32vl', { ttlS: 600 });
    await flash(client, {
      deviceId: 'sim-stm32vl',
      imagePath: elf,
      approved: true,
      leaseId: lease.lease_id,
      projectRoot: d.project,
    });
    const serial = new lib.SerialSession(client, 'sim-stm32vl', { leaseId: lease.lease_id });
    const opened = new Promise((r) => serial.once('opened', r));
    await serial.open();
    await opened;
    const faulted = linesUntil(serial, /^FAULT/);
    serial.sendLine('fault');
    await faulted;
    serial.close();

    const capture = await lib.captureFault(client, 'sim-stm32vl', lease.lease_id);
    assert.equal(capture.format, 'fwai-fault-capture');
    assert.match(capture.fault.summary, /^HardFault .* in trigger_fault at src\/main\.c:\d+/);
    const file = lib.saveCapture(d.project, 'sim-stm32vl', capture);
    assert.match(path.relative(d.project, file), /^\.fwai\/captures\/sim-stm32vl-\d{8}-\d{6}\.fwcap$/);
    assert.equal(fs.statSync(file).mode & 0o777, 0o600);

    await d.stop('SIGTERM'); // offline: no fwaid, no board
    const decoded = await lib.decodeCapture(path.join(BIN, 'fwai'), file, elf);
    const frame = decoded.frames.find((f) => f.func === 'trigger_fault');
    assert.ok(frame, JSON.stringify(decoded.frames));
    assert.equal(`trigger_fault at ${frame.file}:${frame.line}`, capture.fault.location);
    assert.deepEqual(
      frame.locals.map((v) => v.name),
      ['bad'],
    );
    const report = lib.captureReport(decoded, file);
    assert.match(report, /^# Fault on sim-stm32vl/);
    assert.match(
      report,
      /\*\*HardFault at pc=0x[0-9a-f]{8} in trigger_fault at src\/main\.c:\d+: bus fault: precise data bus error/,
    );
    assert.match(report, /## Backtrace/);
    assert.match(report, /\*\*main\*\* at `src\/main\.c:\d+`/);
    assert.match(report, /FAULT: hard fault at pc=/);
    // Another image: the CLI's words, naming the sha256 the capture needs.
    const other = path.join(d.project, 'other.elf');
    fs.writeFileSync(other, Buffer.concat([fs.readFileSync(elf), Buffer.from('x')]));
    await assert.rejects(
      lib.decodeCapture(path.join(BIN, 'fwai'), file, other),
      new RegExp(`needs the image with sha256 ${capture.image.sha256}`),
    );
    const cut = path.join(d.project, 'cut.fwcap');
    fs.writeFileSync(cut, fs.readFileSync(file).subarray(0, 100));
    await assert.rejects(
      lib.decodeCapture(path.join(BIN, 'fwai'), cut, elf),
      /is not a fault capture: it is cut short/,
    );
  },
);
