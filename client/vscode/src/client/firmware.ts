// What fwaid knows about a project's firmware (the Firmware and Ota services,
// as `fwai mem`, `fwai sbom` and `fwai ota ls|boards` show it): memory use per
// region, section and symbol against the budgets; the SBOM of what was built
// and flashed; OTA rollouts and what each board runs.
import { FwaiClient } from './connection';

export interface MemoryReport {
  /** For people: regions, sections, top symbols, the diff and budget verdicts. */
  text: string;
  report: any;
}

/** Memory use of `image` ("" : the project's newest build), against `diff` ("" : the previous build). */
export async function memoryReport(
  client: FwaiClient,
  projectRoot: string,
  image = '',
  diff = '',
): Promise<MemoryReport> {
  const r = await client.call('Firmware', 'Memory', { project_root: projectRoot, image, diff }, 120000);
  return { text: r.text, report: r.json ? JSON.parse(r.json) : null };
}

/** The SBOM (CycloneDX 1.6 or SPDX) of a run or image ("" : the project's newest build). */
export async function sbom(
  client: FwaiClient,
  projectRoot: string,
  runOrImage = '',
  format: 'cyclonedx' | 'spdx' = 'cyclonedx',
): Promise<any> {
  const r = await client.call(
    'Firmware',
    'Sbom',
    { project_root: projectRoot, run_or_image: runOrImage, format },
    120000,
  );
  return JSON.parse(r.json);
}

/** OTA rollouts, newest first, and what every board runs (slots, version, last rollout). */
export async function otaStatus(client: FwaiClient, limit = 50): Promise<{ rollouts: any[]; boards: any }> {
  const list = await client.call('Ota', 'ListRollouts', { limit });
  const boards = await client.call('Ota', 'Boards', {});
  return {
    rollouts: list.rollouts.map((r) => JSON.parse(r.json)),
    boards: boards.json ? JSON.parse(boards.json) : null,
  };
}

/** One finding of `fwai check registers --json` (docs/registers.md). */
export interface RegisterFinding {
  file: string;
  line: number;
  column: number;
  severity: 'error' | 'warning';
  kind: string;
  symbol: string;
  code_says: string;
  svd_says: string;
  source: string;
  fix: string;
}

export interface RegisterReport {
  findings: RegisterFinding[];
  checked: {
    svd: string;
    device: string;
    files: number;
    lines: number;
    accesses: number;
    errors: number;
    warnings: number;
  };
  skipped: { path: string; why: string }[];
}

/** The project's register code against its device's SVD (as `fwai check registers`). */
export async function checkRegisters(
  client: FwaiClient,
  projectRoot: string,
  opts: { paths?: string[]; svd?: string; target?: string } = {},
): Promise<RegisterReport> {
  const r = await client.call(
    'Firmware',
    'CheckRegisters',
    { project_root: projectRoot, paths: opts.paths ?? [], svd: opts.svd ?? '', target: opts.target ?? '' },
    120000,
  );
  return JSON.parse(r.json);
}
