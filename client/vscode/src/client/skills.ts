// A project's skills (Skills.List) and skill runs (Skills.Run): streamed
// steps, output and typed diagnostics.
import * as grpc from '@grpc/grpc-js';
import type { Skill__Output } from '../generated/fwai/v1/Skill';
import type { SkillEvent__Output } from '../generated/fwai/v1/SkillEvent';
import { FwaiClient } from './connection';
import { toFwaiError, FwaiError } from './errors';

/** One event of a run; `kind`: run_started | step_started | output | diagnostic | step_skipped | step_retry | step_finished | run_finished. */
export type SkillEvent = SkillEvent__Output;
/** A skill as Skills.List describes it: name, steps, whether it flashes, its variables. */
export type SkillInfo = Skill__Output;

/** The skills of the project at `projectRoot` (built-in ones and the project's own). */
export async function listSkills(client: FwaiClient, projectRoot: string): Promise<SkillInfo[]> {
  const r = await client.call('Skills', 'List', { project_root: projectRoot });
  return r.skills;
}

export interface Diagnostic {
  file: string;
  line: number; // 1-based, 0 when unknown
  column: number; // 1-based, 0 when unknown
  severity: 'error' | 'warning' | 'note';
  message: string;
  kind: string;
  step: string;
}

/** The typed diagnostic a `diagnostic` event carries, or null. */
export function diagnosticOf(ev: SkillEvent): Diagnostic | null {
  if (ev.kind !== 'diagnostic' || !ev.json) return null;
  let j: any;
  try {
    j = JSON.parse(ev.json);
  } catch {
    return null;
  }
  const sev = j.severity === 'error' || j.severity === 'warning' ? j.severity : 'note';
  let message = String(j.message ?? '');
  if (j.region) message += ` (region ${j.region}${j.bytes ? `, ${j.bytes} bytes` : ''})`;
  if (j.symbol && !message.includes(j.symbol)) message += ` [${j.symbol}]`;
  return {
    file: String(j.file ?? ''),
    line: Number(j.line ?? 0),
    column: Number(j.column ?? 0),
    severity: sev,
    message,
    kind: String(j.kind ?? ''),
    step: ev.step,
  };
}

export interface SkillRunOptions {
  projectRoot: string;
  skill: string;
  vars?: Record<string, string>;
  approved?: boolean;
  board?: string;
  timeoutS?: number;
}

export interface SkillRunResult {
  runId: string;
  ok: boolean;
  summary: any;
  diagnostics: Diagnostic[];
  error: FwaiError | null;
}

/** Runs a skill; `onEvent` sees every event. Resolves when the run ends (never rejects). */
export async function runSkill(
  client: FwaiClient,
  o: SkillRunOptions,
  onEvent: (ev: SkillEvent) => void,
  signal?: { onCancel(cb: () => void): void },
): Promise<SkillRunResult> {
  const result: SkillRunResult = { runId: '', ok: false, summary: null, diagnostics: [], error: null };
  let stream: grpc.ClientReadableStream<SkillEvent>;
  try {
    stream = await client.serverStream('Skills', 'Run', {
      project_root: o.projectRoot,
      skill: o.skill,
      ci: false,
      vars: o.vars ?? {},
      approved: !!o.approved,
      board: o.board ?? '',
      timeout_s: o.timeoutS ?? 0,
    });
  } catch (e) {
    result.error = toFwaiError(e);
    return result;
  }
  signal?.onCancel(() => stream.cancel());
  return new Promise((resolve) => {
    stream.on('data', (ev: SkillEvent) => {
      if (ev.run_id) result.runId = ev.run_id;
      const d = diagnosticOf(ev);
      if (d) result.diagnostics.push(d);
      if (ev.kind === 'run_finished') {
        result.ok = ev.ok;
        try {
          result.summary = ev.json ? JSON.parse(ev.json) : null;
        } catch {
          result.summary = null;
        }
      }
      onEvent(ev);
    });
    stream.on('error', (e) => {
      result.error = toFwaiError(e);
      resolve(result);
    });
    stream.on('end', () => resolve(result));
  });
}
