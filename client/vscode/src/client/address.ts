// Where the daemon is: the same rules as the fwai CLI (client/lib/client.cc),
// plus `tls:HOST:PORT` for a lab daemon.
import * as os from 'node:os';
import * as path from 'node:path';

export type DaemonAddress =
  | { kind: 'unix'; path: string; isDefault: boolean; target: string }
  | { kind: 'tcp'; host: string; port: number; target: string }
  | { kind: 'tls'; host: string; port: number; target: string };

export type Env = Record<string, string | undefined>;

/** `$XDG_RUNTIME_DIR/fwai/fwaid.sock`, else `/tmp/fwai-<uid>/fwaid.sock` (as fwaid). */
export function defaultSocketPath(env: Env = process.env): string {
  const xdg = env.XDG_RUNTIME_DIR;
  const dir = xdg ? path.join(xdg, 'fwai') : `/tmp/fwai-${typeof process.getuid === 'function' ? process.getuid() : 0}`;
  return path.join(dir, 'fwaid.sock');
}

function hostPort(text: string, what: string): { host: string; port: number } {
  // [v6]:port or host:port
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(text) ?? /^([^:]+):(\d+)$/.exec(text);
  if (!m) throw new Error(`daemon address '${what}': expected HOST:PORT after the scheme`);
  const port = Number(m[2]);
  if (!(port > 0 && port < 65536)) throw new Error(`daemon address '${what}': port ${m[2]} is out of range`);
  return { host: m[1], port };
}

/**
 * The setting if set, else `$FWAI_DAEMON`, else the default local socket.
 * Accepts `unix:PATH`, an absolute socket path, `tcp:HOST:PORT`, `HOST:PORT`
 * and `tls:HOST:PORT`. Throws an Error naming the bad address.
 */
export function resolveDaemonAddress(setting: string | undefined, env: Env = process.env): DaemonAddress {
  let a = (setting ?? '').trim();
  if (!a) a = (env.FWAI_DAEMON ?? '').trim();
  if (!a) {
    const p = defaultSocketPath(env);
    return { kind: 'unix', path: p, isDefault: true, target: `unix:${p}` };
  }
  if (a.startsWith('unix:') || a.startsWith('/')) {
    let p = a.startsWith('unix:') ? a.slice(5) : a;
    if (p.startsWith('~/')) p = path.join(os.homedir(), p.slice(2));
    if (!p) throw new Error(`daemon address '${a}': unix: needs a socket path`);
    return { kind: 'unix', path: p, isDefault: false, target: `unix:${p}` };
  }
  if (a.startsWith('tls:')) {
    const hp = hostPort(a.slice(4), a);
    return { kind: 'tls', ...hp, target: `${hp.host.includes(':') ? `[${hp.host}]` : hp.host}:${hp.port}` };
  }
  if (a.startsWith('tcp:') || /:\d+$/.test(a)) {
    const hp = hostPort(a.startsWith('tcp:') ? a.slice(4) : a, a);
    return { kind: 'tcp', ...hp, target: `${hp.host.includes(':') ? `[${hp.host}]` : hp.host}:${hp.port}` };
  }
  throw new Error(`daemon address '${a}': expected unix:PATH, tcp:HOST:PORT or tls:HOST:PORT`);
}

/** True for addresses whose traffic never leaves the machine. */
export function isLocal(addr: DaemonAddress): boolean {
  if (addr.kind === 'unix') return true;
  return addr.host === 'localhost' || addr.host === '::1' || addr.host.startsWith('127.');
}

export function describeAddress(addr: DaemonAddress): string {
  return addr.kind === 'unix' ? `unix:${addr.path}` : `${addr.kind}:${addr.target}`;
}
