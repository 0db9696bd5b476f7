// A file's changes as hunks without context: what a turn's review keeps or
// reverts one at a time. Pure: no Node or vscode imports.
import { applyPatch, reversePatch, structuredPatch } from 'diff';

/** A changed region: lines [start, start + oldLines) before became [newStart, newStart + newLines) now (0-based). */
export interface Hunk {
  oldStart: number;
  oldLines: string[];
  newStart: number;
  newLines: string[];
}

/** The hunks that turn `before` into `now`, without context lines. */
export function hunksOf(before: string, now: string): Hunk[] {
  const patch = structuredPatch('a', 'b', before, now, '', '', { context: 0 });
  return patch.hunks.map((h) => {
    const oldLines: string[] = [];
    const newLines: string[] = [];
    // Lines without their end (a CRLF file's \r too): the editor adds its own.
    const bare = (l: string) => l.slice(1).replace(/\r$/, '');
    for (const l of h.lines) {
      if (l.startsWith('-')) oldLines.push(bare(l));
      else if (l.startsWith('+')) newLines.push(bare(l));
    }
    // 1-based starts; a side of no lines starts at the line after the change.
    return { oldStart: h.oldStart - 1, oldLines, newStart: h.newStart - 1, newLines };
  });
}

/**
 * `now` with one of hunksOf(before, now) put back as it was in `before`; the
 * rest of `now` as it is, line ends and a missing last newline included.
 * Throws when `h` is not a hunk of before → now.
 */
export function withHunkReverted(before: string, now: string, h: Hunk): string {
  const patch = structuredPatch('a', 'b', before, now, '', '', { context: 0 });
  const one = patch.hunks.find((x) => x.oldStart - 1 === h.oldStart && x.newStart - 1 === h.newStart);
  if (!one) throw new Error('that change is no longer in the file');
  const back = applyPatch(now, reversePatch({ ...patch, hunks: [one] }));
  if (back === false) throw new Error('that change could not be put back');
  return back;
}
