// The client side of the lab-daemon contract: `tls:HOST:PORT`, a CA file, an
// optional client certificate (mTLS) and the token as `authorization: Bearer`.
// Checked against a TLS gRPC server serving fwai.v1.Daemon, with certificates
// made by openssl for the test.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const { BIN, Daemon, FakeLlm, PROTO_ROOT, waitFor } = require('../support/fixtures.cjs');
const lib = require('../../out/client.js');

let dir;
let server;
let port;
const seen = [];

function openssl(args) {
  execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
}

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fwai-vscode-tls-'));
  // A CA, a server certificate for 127.0.0.1/localhost and a client certificate.
  openssl([
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-days',
    '2',
    '-subj',
    '/CN=fwai test CA',
    '-keyout',
    'ca.key',
    '-out',
    'ca.pem',
  ]);
  for (const [name, ext] of [
    ['server', 'subjectAltName=IP:127.0.0.1,DNS:localhost'],
    ['client', 'extendedKeyUsage=clientAuth'],
  ]) {
    openssl([
      'req',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-subj',
      `/CN=${name === 'client' ? 'alice' : 'localhost'}`,
      '-keyout',
      `${name}.key`,
      '-out',
      `${name}.csr`,
    ]);
    fs.writeFileSync(path.join(dir, `${name}.ext`), ext + '\n');
    openssl([
      'x509',
      '-req',
      '-in',
      `${name}.csr`,
      '-CA',
      'ca.pem',
      '-CAkey',
      'ca.key',
      '-CAcreateserial',
      '-days',
      '2',
      '-extfile',
      `${name}.ext`,
      '-out',
      `${name}.pem`,
    ]);
  }
  const pkg = lib.loadFwaiPackage(PROTO_ROOT);
  server = new grpc.Server();
  server.addService(pkg.Daemon.service, {
    Status(call, cb) {
      const auth = call.metadata.get('authorization')[0] ?? '';
      const client = call.metadata.get('fwai-client')[0] ?? '';
      const cert = call.getAuthContext?.()?.sslPeerCertificate;
      seen.push({ auth, client, peerCn: cert?.subject?.CN ?? '' });
      if (auth !== 'Bearer tok-123')
        return cb({ code: grpc.status.UNAUTHENTICATED, details: 'token: missing or not valid' });
      cb(null, { version: 'tls-test', caller: `token:alice cert:${cert?.subject?.CN ?? '-'}` });
    },
  });
  const creds = grpc.ServerCredentials.createSsl(
    fs.readFileSync(path.join(dir, 'ca.pem')),
    [
      {
        private_key: fs.readFileSync(path.join(dir, 'server.key')),
        cert_chain: fs.readFileSync(path.join(dir, 'server.pem')),
      },
    ],
    true /* require a client certificate */,
  );
  port = await new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', creds, (e, p) => (e ? reject(e) : resolve(p))),
  );
});

after(() => {
  server?.forceShutdown();
  fs.rmSync(dir, { recursive: true, force: true });
});

const files = () => ({
  caFile: path.join(dir, 'ca.pem'),
  certFile: path.join(dir, 'client.pem'),
  keyFile: path.join(dir, 'client.key'),
});

test('tls: with the CA, a client certificate and the token from a provider function', async () => {
  let asked = 0;
  const client = await lib.FwaiClient.connect({
    address: `tls:127.0.0.1:${port}`,
    protoRoot: PROTO_ROOT,
    clientName: 'vscode 0.1.0',
    ...files(),
    token: async () => {
      asked++;
      return 'tok-123';
    },
  });
  try {
    const st = await client.call('Daemon', 'Status', {});
    assert.equal(st.version, 'tls-test');
    assert.equal(st.caller, 'token:alice cert:alice');
    assert.ok(asked >= 1);
    const last = seen[seen.length - 1];
    assert.equal(last.auth, 'Bearer tok-123');
    assert.equal(last.client, 'vscode 0.1.0');
  } finally {
    client.close();
  }
});

test("tls: a wrong token is the daemon's UNAUTHENTICATED, with its message", async () => {
  const client = await lib.FwaiClient.connect({
    address: `tls:127.0.0.1:${port}`,
    protoRoot: PROTO_ROOT,
    ...files(),
    token: 'nope',
  });
  try {
    await assert.rejects(
      client.call('Daemon', 'Status', {}),
      (e) => e.codeName === 'UNAUTHENTICATED' && /token/.test(e.message),
    );
  } finally {
    client.close();
  }
});

test('tls: without the client certificate the handshake fails and the error names the daemon', async () => {
  await assert.rejects(
    lib.FwaiClient.connect({
      address: `tls:127.0.0.1:${port}`,
      protoRoot: PROTO_ROOT,
      caFile: files().caFile,
      token: 'tok-123',
      connectTimeoutMs: 1500,
    }),
    (e) =>
      /cannot reach fwaid at tls:127\.0\.0\.1:\d+: fwaid at 127\.0\.0\.1:\d+ asks for a client certificate: set fwai\.clientCertFile and fwai\.clientKeyFile/.test(
        e.message,
      ) && e.unreachable?.kind === 'client-certificate',
  );
});

test("tls: a CA that did not sign the daemon's certificate is refused", async () => {
  const other = path.join(dir, 'other');
  fs.mkdirSync(other, { recursive: true });
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-days',
      '1',
      '-subj',
      '/CN=other CA',
      '-keyout',
      path.join(other, 'ca.key'),
      '-out',
      path.join(other, 'ca.pem'),
    ],
    { stdio: 'pipe' },
  );
  await assert.rejects(
    lib.FwaiClient.connect({
      address: `tls:127.0.0.1:${port}`,
      protoRoot: PROTO_ROOT,
      ...files(),
      caFile: path.join(other, 'ca.pem'),
      connectTimeoutMs: 1500,
    }),
    (e) =>
      e.message.includes(
        `fwaid answered at 127.0.0.1:${port}, but its certificate is not trusted by the CA in ${path.join(other, 'ca.pem')} (fwai.caFile)`,
      ) &&
      /Set fwai\.caFile to the CA that issued fwaid's certificate/.test(e.message) &&
      e.unreachable?.kind === 'untrusted',
  );
  // No CA at all: the system's CAs do not know the test CA either, and the message says which were used.
  await assert.rejects(
    lib.FwaiClient.connect({
      address: `tls:127.0.0.1:${port}`,
      protoRoot: PROTO_ROOT,
      certFile: files().certFile,
      keyFile: files().keyFile,
      connectTimeoutMs: 1500,
    }),
    (e) => /not trusted by the system's CAs \(fwai\.caFile is not set\)/.test(e.message),
  );
});

test('nothing listening, or a name that does not resolve, is said as such', async () => {
  const net = require('node:net');
  const free = await new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
  await assert.rejects(
    lib.FwaiClient.connect({ address: `tls:127.0.0.1:${free}`, protoRoot: PROTO_ROOT, connectTimeoutMs: 1000 }),
    (e) =>
      e.message.startsWith(
        `cannot reach fwaid at tls:127.0.0.1:${free}: nothing listens at 127.0.0.1:${free} (connection refused)`,
      ) && e.unreachable?.kind === 'refused',
  );
  await assert.rejects(
    lib.FwaiClient.connect({ address: 'tls:no-such-host.invalid:7447', protoRoot: PROTO_ROOT, connectTimeoutMs: 1000 }),
    (e) =>
      /the host name no-such-host\.invalid does not resolve/.test(e.message) && e.unreachable?.kind === 'unresolved',
  );
});

test('a token is never sent in clear text off the machine; settings are checked', async () => {
  const remote = lib.FwaiClient.create({ address: 'tcp:192.0.2.1:7447', protoRoot: PROTO_ROOT, token: 't' });
  await assert.rejects(
    remote.call('Daemon', 'Status', {}),
    /refusing to send the token in clear text to tcp:192\.0\.2\.1:7447/,
  );
  remote.close();
  const loopback = lib.FwaiClient.create({ address: 'tcp:127.0.0.1:7447', protoRoot: PROTO_ROOT, token: 't' });
  assert.equal((await loopback.metadata()).get('authorization')[0], 'Bearer t');
  loopback.close();
  const addr = lib.resolveDaemonAddress('tcp:192.0.2.1:7447');
  assert.equal(lib.isLocal(addr), false);
  assert.equal(lib.isLocal(lib.resolveDaemonAddress('tcp:127.0.0.1:7447')), true);
  assert.throws(() => lib.makeCredentials(lib.resolveDaemonAddress('tcp:127.0.0.1:1'), { caFile: '/x' }), /not tls:/);
  assert.throws(() => lib.makeCredentials(lib.resolveDaemonAddress('tls:h:1'), { certFile: files().certFile }), /both/);
  assert.throws(
    () => lib.makeCredentials(lib.resolveDaemonAddress('tls:h:1'), { caFile: '/nonexistent/ca.pem' }),
    /fwai.caFile \/nonexistent\/ca.pem/,
  );
});

test(
  'a real fwaid on tls: with a token made by its admin: status, a chat turn streamed, no token refused',
  { timeout: 120000 },
  async (t) => {
    const fake = await FakeLlm.start();
    t.after(() => fake.stop());
    const certs = fs.mkdtempSync(path.join(os.tmpdir(), 'fwai-vscode-fwaid-tls-'));
    t.after(() => fs.rmSync(certs, { recursive: true, force: true }));
    execFileSync(path.join(BIN, 'fwaid'), ['tls', 'init', certs, '--host', 'localhost', '--host', '127.0.0.1'], {
      stdio: 'pipe',
    });
    const d = new Daemon(fake, `tls: {cert: ${certs}/server.pem, key: ${certs}/server.key}\n`);
    d.extraListen = ['tls:127.0.0.1:0'];
    t.after(() => d.cleanup());
    await d.start();
    await waitFor(() => d.tcpPort() > 0, 'the tls listener');
    const address = `tls:localhost:${d.tcpPort()}`;
    // The unix socket's root peer is the admin; the token is shown once on stdout.
    const token = d.cli(['token', 'create', 'alice', '--role', 'user'], { stdio: ['ignore', 'pipe', 'pipe'] }).trim();
    assert.match(token, /^fwai_/);

    const anonymous = await lib.FwaiClient.connect({
      address,
      protoRoot: PROTO_ROOT,
      caFile: path.join(certs, 'ca.pem'),
    });
    t.after(() => anonymous.close());
    await assert.rejects(anonymous.call('Daemon', 'Status', {}), (e) => e.codeName === 'UNAUTHENTICATED');
    const wrong = await lib.FwaiClient.connect({
      address,
      protoRoot: PROTO_ROOT,
      caFile: path.join(certs, 'ca.pem'),
      token: token.slice(0, -2) + 'xx',
    });
    t.after(() => wrong.close());
    await assert.rejects(wrong.call('Daemon', 'Status', {}), (e) => e.codeName === 'UNAUTHENTICATED');
    // What an editor shows for each refusal: the daemon's words, and the command that fixes it.
    const advice = async (c) => {
      try {
        await c.call('Daemon', 'Status', {});
      } catch (e) {
        return lib.errorAdvice(e, address);
      }
      return '';
    };
    assert.match(await advice(anonymous), /^fwaid at tls:localhost:\d+ wants a token: run "fwai: Set Daemon Token"/);
    assert.doesNotMatch(await advice(anonymous), /FWAI_TOKEN|--token-file/);
    const malformed = await lib.FwaiClient.connect({
      address,
      protoRoot: PROTO_ROOT,
      caFile: path.join(certs, 'ca.pem'),
      token: 'not-a-token',
    });
    t.after(() => malformed.close());
    assert.match(
      await advice(malformed),
      /^the token set in VS Code is malformed \(expected fwai_ and 54 more characters, as fwai token create prints it\): run "fwai: Set Daemon Token"/,
    );
    assert.match(await advice(wrong), /run "fwai: Set Daemon Token"/);

    const client = await lib.FwaiClient.connect({
      address,
      protoRoot: PROTO_ROOT,
      clientName: 'vscode-test',
      caFile: path.join(certs, 'ca.pem'),
      token,
    });
    t.after(() => client.close());
    const st = await client.call('Daemon', 'Status', {});
    assert.match(st.caller, /alice/);

    // A session of alice's (no local account: chat without project tools), a turn streamed over TLS.
    await fake.reset();
    await fake.enqueue([{ chunks: ['over ', 'tls'] }]);
    const s = await client.call('Sessions', 'Create', { title: 'tls', mode: 'act' });
    const stream = new lib.SessionStream(client, s.id);
    const model = new lib.SessionModel(s.id);
    const done = new Promise((resolve) =>
      stream.on('event', (ev) => {
        model.apply(ev);
        if (ev.payload === 'turn_finished') resolve();
      }),
    );
    stream.start();
    await waitFor(() => stream.state === 'open', 'the stream to open');
    const turn = stream.sendMessage('hello');
    await done;
    assert.match(model.outline(turn), /text\(main\): over tls/);
    stream.close();
    const mine = await client.call('Sessions', 'List', {});
    assert.ok(mine.sessions.some((x) => x.id === s.id));
  },
);
