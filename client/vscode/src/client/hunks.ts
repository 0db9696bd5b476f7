// A file's changes as hunks without context: what a turn's review keeps or
// reverts one at a time. Pure: no Node or vscode imports.
import { structuredPatch } from 'diff';

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
