// Starting fwaid on the default local socket when nothing listens there, the
// way the CLI does (client/lib/client.cc): detached, in its own session, its
// output in fwaid.log next to the socket.
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';

/** True when something accepts connections on the unix socket. */
export function socketAccepts(socketPath: string, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(socketPath);
    const done = (ok: boolean) => {
      clearTimeout(timer);
      s.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), timeoutMs);
    s.once('connect', () => done(true));
    s.once('error', () => done(false));
  });
}

/** Spawns `fwaid --listen unix:PATH` detached; resolves once it was spawned. */
export function spawnDaemon(
  fwaidPath: string,
  socketPath: string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<void> {
  const dir = path.dirname(socketPath);
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  const log = fs.openSync(path.join(dir, 'fwaid.log'), 'a', 0o600);
  return new Promise((resolve, reject) => {
    const child = spawn(fwaidPath || 'fwaid', ['--listen', `unix:${socketPath}`], {
      detached: true,
      stdio: ['ignore', log, log],
      env,
    });
    child.once('error', (e) => {
      fs.closeSync(log);
      reject(
        new Error(
          `cannot start fwaid (${fwaidPath || 'fwaid'}): ${e.message}; set fwai.fwaidPath or put fwaid on PATH`,
        ),
      );
    });
    child.once('spawn', () => {
      fs.closeSync(log);
      child.unref();
      resolve();
    });
  });
}

/** Starts fwaid when nothing listens on `socketPath` and waits until it accepts. */
export async function ensureDaemon(
  fwaidPath: string,
  socketPath: string,
  timeoutMs = 15000,
): Promise<'running' | 'started'> {
  if (await socketAccepts(socketPath)) return 'running';
  await spawnDaemon(fwaidPath, socketPath);
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await socketAccepts(socketPath)) return 'started';
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(
    `started fwaid but it is not answering on ${socketPath}; see ${path.join(path.dirname(socketPath), 'fwaid.log')}`,
  );
}
