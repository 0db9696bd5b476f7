// Test fixtures: a real fwaid (built in <repo>/build/bin) on a unix socket in
// a temp dir, and the fake LLM service (fwai_fake_llm) it talks to. Nothing
// waits for luck: the daemon is ready when its socket accepts, the fake when
// it printed its port.
const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '../../../..');
const BIN = process.env.FWAI_BIN_DIR || path.join(ROOT, 'build', 'bin');
const PROTO_ROOT = path.join(ROOT, 'proto');

function need(bin) {
  const p = path.join(BIN, bin);
  if (!fs.existsSync(p)) throw new Error(`${p} is missing: build first (scripts/build)`);
  return p;
}

function socketAccepts(p) {
  return new Promise((resolve) => {
    const s = net.connect(p);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

async function waitFor(pred, what, timeoutMs = 20000, everyMs = 20) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await pred()) return;
    await new Promise((r) => setTimeout(r, everyMs));
  }
  throw new Error(`timed out waiting for ${what}`);
}

class FakeLlm {
  static async start() {
    const f = new FakeLlm();
    f.proc = spawn(need('fwai_fake_llm'), [], { stdio: ['pipe', 'pipe', 'inherit'] });
    f.port = await new Promise((resolve, reject) => {
      let buf = '';
      f.proc.stdout.on('data', (d) => {
        buf += d;
        const m = /^(\d+)\n/.exec(buf);
        if (m) resolve(Number(m[1]));
      });
      f.proc.once('exit', (code) => reject(new Error(`fwai_fake_llm exited with ${code}`)));
    });
    f.url = `http://127.0.0.1:${f.port}`;
    return f;
  }
  async post(p, body) {
    const r = await fetch(this.url + p, { method: 'POST', body: JSON.stringify(body ?? {}) });
    const j = await r.json();
    if (!r.ok) throw new Error(`fake ${p}: ${JSON.stringify(j)}`);
    return j;
  }
  enqueue(replies) {
    return this.post('/_fake/replies', replies);
  }
  reset() {
    return this.post('/_fake/reset');
  }
  async requests() {
    return (await fetch(this.url + '/_fake/requests')).json();
  }
  async state() {
    return (await fetch(this.url + '/_fake/state')).json();
  }
  stop() {
    this.proc.stdin.end();
    this.proc.kill('SIGTERM');
  }
}

class Daemon {
  constructor(fake, extraYaml = '') {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fwai-vscode-test-'));
    this.socket = path.join(this.dir, 'run', 'fwaid.sock');
    this.data = path.join(this.dir, 'data');
    this.project = path.join(this.dir, 'project');
    this.config = path.join(this.dir, 'fwaid.yaml');
    this.log = path.join(this.dir, 'fwaid.log');
    fs.mkdirSync(this.project, { recursive: true });
    let cfg = 'log_level: info\nretry:\n  max_attempts: 2\n  initial_backoff_ms: 20\n  max_backoff_ms: 100\n';
    if (fake) {
      cfg +=
        `default_provider: anthropic\nproviders:\n  anthropic:\n    kind: anthropic\n    api_key: test-key\n` +
        `    model: claude-sonnet-4-5\n    base_url: ${fake.url}\n`;
    }
    fs.writeFileSync(this.config, cfg + extraYaml);
  }
  get address() {
    return `unix:${this.socket}`;
  }
  async start() {
    const out = fs.openSync(this.log, 'a');
    const env = { ...process.env };
    for (const k of ['ANTHROPIC_API_KEY', 'OPENAI_API_KEY', 'ANTHROPIC_BASE_URL', 'OPENAI_BASE_URL']) delete env[k];
    env.XDG_RUNTIME_DIR = path.join(this.dir, 'xdg-run');
    const listen = [this.address, ...(this.extraListen ?? [])].flatMap((l) => ['--listen', l]);
    this.proc = spawn(need('fwaid'), ['--config', this.config, ...listen, '--data-dir', this.data], {
      stdio: ['ignore', out, out],
      env,
    });
    fs.closeSync(out);
    let exited = null;
    this.proc.once('exit', (code, sig) => {
      exited = code ?? sig;
    });
    await waitFor(async () => {
      if (exited !== null) throw new Error(`fwaid exited (${exited}):\n${this.logText()}`);
      return socketAccepts(this.socket);
    }, 'fwaid to listen');
  }
  /** The port of the last start's tcp:/tls: listener ("listening on tls:127.0.0.1:40123"). */
  tcpPort() {
    const m = [...this.logText().matchAll(/listening on t(?:cp|ls):[^\s]*:(\d+)/g)];
    return m.length ? Number(m[m.length - 1][1]) : 0;
  }
  logText() {
    try {
      return fs.readFileSync(this.log, 'utf8');
    } catch {
      return '';
    }
  }
  stop(signal = 'SIGTERM') {
    if (!this.proc || this.proc.exitCode !== null || this.proc.signalCode) return Promise.resolve();
    return new Promise((resolve) => {
      this.proc.once('exit', () => resolve());
      this.proc.kill(signal);
    });
  }
  async cleanup() {
    await this.stop('SIGKILL');
    if (!process.env.FWAI_KEEP_TEST_DIRS) fs.rmSync(this.dir, { recursive: true, force: true });
  }
  /** Runs the fwai CLI against this daemon. */
  cli(args, opts = {}) {
    return execFileSync(need('fwai'), ['--daemon', this.address, ...args], {
      encoding: 'utf8',
      cwd: this.project,
      ...opts,
    });
  }
  cliSpawn(args, opts = {}) {
    return spawn(need('fwai'), ['--daemon', this.address, ...args], { cwd: this.project, ...opts });
  }
}

module.exports = { ROOT, BIN, PROTO_ROOT, FakeLlm, Daemon, waitFor, socketAccepts };
