// The knowledge base: adding documents (Knowledge.Ingest, streamed in 1 MB
// pieces with the daemon's progress) and searching it.
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { IngestProgress__Output } from '../generated/fwai/v1/IngestProgress';
import type { SearchResponse__Output } from '../generated/fwai/v1/SearchResponse';
import type { SearchResult__Output } from '../generated/fwai/v1/SearchResult';
import { FwaiClient } from './connection';
import { toFwaiError } from './errors';

export const MAX_DOCUMENT_BYTES = 50 << 20;
const PIECE = 1 << 20;

export type IngestProgress = IngestProgress__Output;

export interface IngestOutcome {
  file: string;
  ok: boolean;
  error?: string;
  last?: IngestProgress;
}

/** Files under `p` (a file, or a folder walked recursively, dot-folders skipped). */
export function expandPaths(paths: string[]): string[] {
  const out: string[] = [];
  const walk = (p: string) => {
    const st = fs.statSync(p);
    if (st.isDirectory()) {
      for (const e of fs.readdirSync(p).sort()) {
        if (e.startsWith('.') || e === 'node_modules') continue;
        walk(path.join(p, e));
      }
    } else if (st.isFile()) {
      out.push(p);
    }
  };
  for (const p of paths) walk(p);
  return out;
}

/** Ingests one file under its absolute path (what search results then name). */
export async function ingestFile(
  client: FwaiClient,
  file: string,
  o: { collection?: string; kind?: string } = {},
  onProgress: (p: IngestProgress) => void = () => {},
): Promise<IngestOutcome> {
  const abs = path.resolve(file);
  let data: Buffer;
  try {
    const st = fs.statSync(abs);
    if (st.size > MAX_DOCUMENT_BYTES) {
      return { file: abs, ok: false, error: `${abs}: ${(st.size / 1e6).toFixed(1)} MB is over the 50 MB limit` };
    }
    data = fs.readFileSync(abs);
  } catch (e) {
    return { file: abs, ok: false, error: `${abs}: cannot read: ${(e as Error).message}` };
  }
  const mtime = fs.statSync(abs).mtimeMs;
  const call = await client.bidi('Knowledge', 'Ingest');
  return new Promise((resolve) => {
    let last: IngestProgress | undefined;
    let settled = false;
    const done = (r: IngestOutcome) => {
      if (!settled) {
        settled = true;
        resolve(r);
      }
    };
    call.on('data', (p: IngestProgress) => {
      last = p;
      onProgress(p);
    });
    call.on('error', (e) => done({ file: abs, ok: false, error: toFwaiError(e).message, last }));
    call.on('end', () => done({ file: abs, ok: true, last }));
    call.write({
      header: {
        name: abs,
        collection: o.collection ?? '',
        tags: [],
        kind: o.kind ?? '',
        size: data.length,
        modified_us: Math.round(mtime * 1000),
      },
    });
    for (let off = 0; off < data.length; off += PIECE) call.write({ data: data.subarray(off, off + PIECE) });
    call.end();
  });
}

export type SearchResult = SearchResult__Output;
/** The results, best first, the time taken, and the search's id in the retrieval log. */
export type SearchResponse = SearchResponse__Output;

export async function search(
  client: FwaiClient,
  query: string,
  o: { maxResults?: number; collection?: string } = {},
): Promise<SearchResponse> {
  return client.call('Knowledge', 'Search', {
    query,
    max_results: o.maxResults ?? 20,
    collection: o.collection ?? '',
  });
}
