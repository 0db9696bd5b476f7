import * as grpc from '@grpc/grpc-js';

/** A failed call: the gRPC status name and the daemon's own message. */
export class FwaiError extends Error {
  constructor(
    readonly code: grpc.status,
    readonly details: string,
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
