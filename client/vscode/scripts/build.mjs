// Generates the API's TypeScript types from the daemon's protos
// (src/generated, scripts/gen-types.mjs), bundles the extension (node), the
// chat webview (browser) and the vscode-free client library (node, for the
// tests) with esbuild, and copies the protos next to them. `--production`
// minifies and drops source maps.
import * as esbuild from 'esbuild';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { generateTypes } from './gen-types.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..');
const production = process.argv.includes('--production');
const dist = path.join(root, 'dist');

generateTypes();
fs.rmSync(dist, { recursive: true, force: true });
const common = {
  bundle: true,
  sourcemap: !production,
  minify: production && !process.env.FWAI_NO_MINIFY,
  logLevel: 'warning',
  legalComments: 'none',
};
await Promise.all([
  esbuild.build({
    ...common,
    entryPoints: [path.join(root, 'src/extension/extension.ts')],
    outfile: path.join(dist, 'extension.js'),
    platform: 'node',
    format: 'cjs',
    target: 'node20',
    external: ['vscode'],
  }),
  esbuild.build({
    ...common,
    entryPoints: [path.join(root, 'src/client/index.ts')],
    outfile: path.join(root, 'out', 'client.js'),
    platform: 'node',
    format: 'cjs',
    target: 'node20',
    minify: false,
  }),
  esbuild.build({
    ...common,
    entryPoints: [path.join(root, 'src/webview/chat.ts')],
    outfile: path.join(dist, 'webview', 'chat.js'),
    platform: 'browser',
    format: 'iife',
    target: 'es2022',
  }),
]);
fs.copyFileSync(path.join(root, 'src/webview/chat.css'), path.join(dist, 'webview', 'chat.css'));
// The API the extension speaks: fwaid's own protos (proto-loader reads them at run time).
const protoSrc = path.resolve(root, '../../proto/fwai/v1');
const protoDst = path.join(dist, 'proto', 'fwai', 'v1');
fs.mkdirSync(protoDst, { recursive: true });
for (const f of fs.readdirSync(protoSrc)) {
  if (f.endsWith('.proto')) fs.copyFileSync(path.join(protoSrc, f), path.join(protoDst, f));
}
