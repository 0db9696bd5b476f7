import * as grpc from '@grpc/grpc-js';
import type { Unreachable } from './reach';

/** A failed call: the gRPC status name and the daemon's own message. */
export class FwaiError extends Error {
  constructor(
    readonly code: grpc.status,
    readonly details: string,
    /** For UNAVAILABLE over TCP: what the connection probe found. */
    readonly unreachable: Unreachable | null = null,
  ) {
    super(details || grpc.status[code] || 'error');
    this.name = `FwaiError(${grpc.status[code] ?? code})`;
  }
  get codeName(): string {
    return grpc.status[this.code] ?? String(this.code);
  }
}

export function toFwaiError(e: unknown): FwaiError {
  if (e instanceof FwaiError) return e;
  const se = e as Partial<grpc.ServiceError>;
  if (se && typeof se.code === 'number') return new FwaiError(se.code, se.details ?? se.message ?? '');
  return new FwaiError(grpc.status.UNKNOWN, e instanceof Error ? e.message : String(e));
}

/** Codes after which retrying the same stream can succeed. */
export function isTransient(code: grpc.status): boolean {
  return (
    code === grpc.status.UNAVAILABLE ||
    code === grpc.status.RESOURCE_EXHAUSTED ||
    code === grpc.status.INTERNAL ||
    code === grpc.status.UNKNOWN ||
    code === grpc.status.CANCELLED ||
    code === grpc.status.DEADLINE_EXCEEDED ||
    code === grpc.status.ABORTED
  );
}

/**
 * What an editor shows for a failed call: the daemon's words and, for a
 * refused token, the command that fixes it (the daemon's own hint names the
 * CLI's FWAI_TOKEN and --token-file, which do not apply in an editor).
 */
export function errorAdvice(e: unknown, address = ''): string {
  const fe = toFwaiError(e);
  const fix = 'run "fwai: Set Daemon Token"';
  if (fe.code !== grpc.status.UNAUTHENTICATED) return fe.message;
  const d = fe.details;
  if (!d) return `fwaid${address ? ` at ${address}` : ''} refused the credentials (it gave no reason): ${fix}`;
  if (/^no credentials/.test(d)) {
    return `fwaid${address ? ` at ${address}` : ''} wants a token: ${fix} (an admin makes one with \`fwai token create\`)`;
  }
  const malformed = /^the token is malformed(.*)$/.exec(d);
  if (malformed) return `the token set in VS Code is malformed${malformed[1]}: ${fix} with a valid one`;
  return `${d}: ${fix} with a valid token`;
}
