// The daemon itself (the Daemon service, as `fwai daemon status` shows it):
// its version, process, listeners, providers, and who it takes the caller for.
import type { DaemonStatus__Output } from '../generated/fwai/v1/DaemonStatus';
import { FwaiClient } from './connection';

export type DaemonStatus = DaemonStatus__Output;

export function daemonStatus(client: FwaiClient, timeoutMs = 30000): Promise<DaemonStatus> {
  return client.call('Daemon', 'Status', {}, timeoutMs);
}

/** The caller's uid when the daemon sees it as a local user ("uid:1000"), else ''. */
export function callerUid(status: Pick<DaemonStatus, 'caller'>): string {
  return /^uid:(\d+)$/.exec(status.caller)?.[1] ?? '';
}
