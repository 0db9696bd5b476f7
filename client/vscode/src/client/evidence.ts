// The evidence log (the Evidence service, as `fwai evidence` shows it): the
// records of agent turns, skill runs and flashes, one opened by id, the log
// verified (hash chain, checkpoints, inclusion proofs), and exports (SARIF,
// HTML, JSON, CSV, in-toto).
import type { RunRecord__Output } from '../generated/fwai/v1/RunRecord';
import type { VerifyResponse__Output } from '../generated/fwai/v1/VerifyResponse';
import { FwaiClient } from './connection';

/** One record of the log: its id, index, leaf hash, and the record as JSON. */
export type EvidenceRun = RunRecord__Output;
export type EvidenceVerification = VerifyResponse__Output;
export type EvidenceFormat = 'json' | 'csv' | 'sarif' | 'html' | 'in-toto';

/** The latest `limit` records, newest first. */
export async function listEvidenceRuns(client: FwaiClient, limit = 200): Promise<EvidenceRun[]> {
  const r = await client.call('Evidence', 'ListRuns', { limit });
  return r.runs.sort((a, b) => b.index - a.index);
}

export function getEvidenceRun(client: FwaiClient, runId: string): Promise<EvidenceRun> {
  return client.call('Evidence', 'GetRun', { run_id: runId });
}

/** Recomputes the hash chain, every signed checkpoint and every record's inclusion proof. */
export function verifyEvidence(client: FwaiClient, timeoutMs = 120000): Promise<EvidenceVerification> {
  return client.call('Evidence', 'Verify', {}, timeoutMs);
}

/** The whole log in `format`. */
export async function exportEvidence(
  client: FwaiClient,
  format: EvidenceFormat,
  timeoutMs = 120000,
): Promise<{ data: Buffer; contentType: string }> {
  const r = await client.call('Evidence', 'Export', { format }, timeoutMs);
  return { data: r.data, contentType: r.content_type };
}
