// SARIF 2.1.0 (as fwaid exports the evidence log) to diagnostics for an
// editor: one SARIF run per skill run; only the latest run of each project is
// kept, since older runs describe code that has changed since.

export interface SarifDiagnostic {
  file: string; // absolute when the run names its project root
  line: number;
  column: number;
  severity: 'error' | 'warning' | 'note';
  message: string;
  rule: string;
  run: string; // automationDetails.id: "<skill>/<run_id>"
}

export function sarifDiagnostics(doc: any, opts: { latestPerProject?: boolean } = {}): SarifDiagnostic[] {
  const runs: any[] = Array.isArray(doc?.runs) ? doc.runs : [];
  const latest = new Map<string, any>();
  const ordered: any[] = [];
  for (const run of runs) {
    const base = String(run?.originalUriBaseIds?.PROJECTROOT?.uri ?? '');
    if (opts.latestPerProject === false) ordered.push(run);
    else latest.set(base, run);
  }
  if (opts.latestPerProject !== false) ordered.push(...latest.values());
  const out: SarifDiagnostic[] = [];
  for (const run of ordered) {
    const base = String(run?.originalUriBaseIds?.PROJECTROOT?.uri ?? '').replace(/^file:\/\//, '');
    for (const r of run.results ?? []) {
      const loc = r.locations?.[0]?.physicalLocation;
      let file = String(loc?.artifactLocation?.uri ?? '');
      if (file && !file.startsWith('/') && loc?.artifactLocation?.uriBaseId === 'PROJECTROOT' && base)
        file = base.replace(/\/?$/, '/') + file;
      out.push({
        file,
        line: Number(loc?.region?.startLine ?? 0),
        column: Number(loc?.region?.startColumn ?? 0),
        severity: r.level === 'error' ? 'error' : r.level === 'warning' ? 'warning' : 'note',
        message: String(r.message?.text ?? ''),
        rule: String(r.ruleId ?? ''),
        run: String(run.automationDetails?.id ?? ''),
      });
    }
  }
  return out;
}
