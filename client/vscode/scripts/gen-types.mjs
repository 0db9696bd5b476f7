// Generates the TypeScript types of fwaid's API from proto/fwai/v1/*.proto
// into src/generated/ (git-ignored) with proto-loader-gen-types, which ships
// with @grpc/proto-loader: one file per message (`Device` for requests,
// `Device__Output` for what the daemon answers) and per service (`HardwareClient`).
// The options are the ones src/client/proto.ts gives proto-loader at run
// time (test/unit/generated.test.cjs holds them equal), so the types describe
// the objects the calls really return. Run by `npm run build` and before
// `npm run typecheck`; nothing is downloaded.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..');
export const PROTO_ROOT = path.resolve(root, '../../proto');
export const GENERATED = path.join(root, 'src', 'generated');

/** proto-loader's run-time options (LOADER_OPTIONS in src/client/proto.ts), as the generator spells them. */
export const GEN_OPTIONS = {
  keepCase: true,
  longs: 'Number',
  enums: 'String',
  defaults: true,
  oneofs: true,
};

export function generateTypes() {
  const files = fs
    .readdirSync(path.join(PROTO_ROOT, 'fwai', 'v1'))
    .filter((f) => f.endsWith('.proto'))
    .sort()
    .map((f) => `fwai/v1/${f}`);
  if (!files.length) throw new Error(`no .proto files in ${PROTO_ROOT}/fwai/v1`);
  const flags = Object.entries(GEN_OPTIONS).map(([k, v]) => (v === true ? `--${k}` : `--${k}=${v}`));
  const bin = path.join(root, 'node_modules', '@grpc', 'proto-loader', 'build', 'bin', 'proto-loader-gen-types.js');
  if (!fs.existsSync(bin)) throw new Error(`${bin} is missing: run npm ci first`);
  // Into a fresh folder, then in place: no file of a removed message lingers.
  const tmp = `${GENERATED}.tmp-${process.pid}`;
  fs.rmSync(tmp, { recursive: true, force: true });
  try {
    execFileSync(
      process.execPath,
      [
        bin,
        ...flags,
        '--grpcLib=@grpc/grpc-js',
        '--includeComments',
        '-I',
        path.relative(root, PROTO_ROOT),
        '-O',
        tmp,
        ...files,
      ],
      { cwd: root, stdio: ['ignore', 'ignore', 'inherit'] },
    );
    fs.rmSync(GENERATED, { recursive: true, force: true });
    fs.renameSync(tmp, GENERATED);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  return files;
}

if (process.argv[1] && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  const files = generateTypes();
  console.log(`generated types of ${files.length} protos in ${path.relative(process.cwd(), GENERATED) || '.'}`);
}
