// File changes the agent made, from its write_file / edit_file calls: the
// path, and how to get the file as it was before the call from the file as it
// is now (for a diff editor).

export interface FileChange {
  callId: string;
  tool: 'write_file' | 'edit_file';
  path: string; // relative to the project root, as the tool took it
  created: boolean; // write_file of a file that did not exist
  /** edit_file: the replacement, to undo on the current text. */
  oldString?: string;
  newString?: string;
  replaceAll?: boolean;
  /** Where the first replaced region starts (1-based), from the result's hunk header. */
  line?: number;
}

/** The change a finished, successful tool call made, or null. */
export function fileChangeOf(
  tool: string,
  inputJson: string,
  result: string,
  callId = '',
  isError = false,
): FileChange | null {
  if (isError || (tool !== 'write_file' && tool !== 'edit_file')) return null;
  let input: any;
  try {
    input = JSON.parse(inputJson || '{}');
  } catch {
    return null;
  }
  if (typeof input.path !== 'string') return null;
  if (tool === 'write_file') {
    return { callId, tool, path: input.path, created: /^created /.test(result) };
  }
  const m = /@@ -(\d+),\d+ \+\d+,\d+ @@/.exec(result);
  return {
    callId,
    tool,
    path: input.path,
    created: false,
    oldString: String(input.old_string ?? ''),
    newString: String(input.new_string ?? ''),
    replaceAll: !!input.replace_all,
    line: m ? Number(m[1]) : undefined,
  };
}

/**
 * The text before an edit_file call, given the text after it: the new string
 * put back to the old one. Null when the current text no longer holds the
 * edit as made (changed again since), so no wrong diff is shown.
 */
export function textBeforeEdit(change: FileChange, current: string): string | null {
  if (change.tool !== 'edit_file' || !change.newString) return null;
  const parts = current.split(change.newString);
  const count = parts.length - 1;
  if (count === 0) return null;
  if (!change.replaceAll && count !== 1) {
    // Several copies now: undo the one nearest the recorded line.
    if (!change.line) return null;
    let best = -1;
    let bestDist = Infinity;
    let offset = 0;
    for (let i = 0; i < count; i++) {
      offset += parts[i].length;
      const line = current.slice(0, offset).split('\n').length;
      const dist = Math.abs(line - change.line);
      if (dist < bestDist) {
        bestDist = dist;
        best = i;
      }
      offset += change.newString.length;
    }
    return (
      parts.slice(0, best + 1).join(change.newString) + change.oldString + parts.slice(best + 1).join(change.newString)
    );
  }
  return parts.join(change.oldString ?? '');
}
