// `file:line[:col]` references in tool output and search results.

export interface FileRef {
  path: string;
  line: number;
  column: number;
  index: number; // where it starts in the text
  length: number;
}

const SOURCE_EXT =
  'c|h|cc|cpp|cxx|hpp|hh|hxx|s|S|asm|ld|lds|py|rs|go|js|ts|json|ya?ml|toml|md|rst|txt|cmake|mk|ini|cfg|conf|dts|dtsi|overlay|svd|ino|x';
// path:line(:col)?, the path having a known extension; also "path(line)" (MSVC/Keil)
const RE = new RegExp(
  String.raw`(?:^|[\s'"(\[<=\x60*])((?:\.{0,2}/)?[\w.+@-]+(?:/[\w.+@-]+)*\.(?:${SOURCE_EXT}))(?::(\d+)(?::(\d+))?|\((\d+)\))`,
  'g',
);

export function findFileRefs(text: string): FileRef[] {
  const out: FileRef[] = [];
  for (const m of text.matchAll(RE)) {
    const path = m[1];
    const line = Number(m[2] ?? m[4]);
    if (!line) continue;
    const start = (m.index ?? 0) + m[0].indexOf(path);
    const end = (m.index ?? 0) + m[0].length;
    out.push({ path, line, column: Number(m[3] ?? 0), index: start, length: end - start });
  }
  return out;
}
