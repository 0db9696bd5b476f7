// The TypeScript types generated from the protos (src/generated, by
// scripts/gen-types.mjs) describe what proto-loader really decodes at run
// time: the same options, and for every message the fields and their JS
// types that an answer of the daemon has.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const protoLoader = require('@grpc/proto-loader');
const { PROTO_ROOT } = require('../support/fixtures.cjs');
const lib = require('../../out/client.js');

const GENERATED = path.resolve(__dirname, '../../src/generated/fwai/v1');

test('the types are generated with the options proto-loader gets at run time', async () => {
  const { GEN_OPTIONS } = await import('../../scripts/gen-types.mjs');
  const runtime = Object.fromEntries(
    Object.entries(lib.LOADER_OPTIONS).map(([k, v]) => [k, typeof v === 'function' ? v.name : v]),
  );
  assert.deepEqual(GEN_OPTIONS, runtime);
});

/** The fields of the generated `<Name>__Output` interface: name -> [type text, optional]. */
function outputFields(name) {
  const file = path.join(GENERATED, `${name}.ts`);
  const text = fs.readFileSync(file, 'utf8');
  const m = new RegExp(`export interface ${name}__Output \\{([\\s\\S]*?)\\n\\}`).exec(text);
  assert.ok(m, `${file} has no ${name}__Output`);
  const fields = new Map();
  for (const f of m[1].matchAll(/^\s*'(\w+)'(\?)?: (.*);$/gm)) fields.set(f[1], [f[3], f[2] === '?']);
  return fields;
}

/** What a generated type says a decoded value is, in typeof terms (or null when it does not say simply). */
function jsKind(typeText) {
  if (/\)\[\]$/.test(typeText)) return 'array';
  if (/\| null\)$/.test(typeText)) return 'null';
  const simple = { '(string)': 'string', '(number)': 'number', '(boolean)': 'boolean', '(Buffer)': 'buffer' };
  if (simple[typeText]) return simple[typeText];
  if (/^\(\{\[key: string\]: /.test(typeText)) return 'map';
  return null;
}
function kindOf(v) {
  if (Array.isArray(v)) return 'array';
  if (v === null) return 'null';
  if (Buffer.isBuffer(v)) return 'buffer';
  if (typeof v === 'object') return 'map';
  return typeof v;
}

test('every message decodes to the fields and JS types its generated __Output type names', () => {
  const def = protoLoader.loadSync(lib.PROTO_FILES, { ...lib.LOADER_OPTIONS, includeDirs: [PROTO_ROOT] });
  let messages = 0;
  for (const [full, t] of Object.entries(def)) {
    if (
      !full.startsWith('fwai.v1.') ||
      typeof t.deserialize !== 'function' ||
      t.format !== 'Protocol Buffer 3 DescriptorProto'
    )
      continue;
    const name = full.slice('fwai.v1.'.length);
    // An empty message: with `defaults`, every field that is not in a oneof is set.
    const decoded = t.deserialize(Buffer.alloc(0));
    const fields = outputFields(name);
    const required = [...fields].filter(([, [, opt]]) => !opt).map(([k]) => k);
    assert.deepEqual(Object.keys(decoded).sort(), required.sort(), `${name}: decoded fields vs ${name}__Output`);
    // 64-bit integers are numbers (longs: Number), enums names, bytes Buffers...
    for (const [k, v] of Object.entries(decoded)) {
      const want = jsKind(fields.get(k)[0]);
      if (want) assert.equal(kindOf(v), want, `${name}.${k}: ${fields.get(k)[0]} but decoded ${JSON.stringify(v)}`);
    }
    messages++;
  }
  assert.ok(messages > 100, `only ${messages} messages checked`);
});

test('every service the client loads has its generated client type with each RPC', () => {
  const def = protoLoader.loadSync(lib.PROTO_FILES, { ...lib.LOADER_OPTIONS, includeDirs: [PROTO_ROOT] });
  const services = Object.entries(def).filter(([, t]) => typeof t.deserialize !== 'function');
  assert.deepEqual(services.map(([k]) => k.slice('fwai.v1.'.length)).sort(), [
    'Daemon',
    'Evidence',
    'Firmware',
    'Hardware',
    'Knowledge',
    'Ota',
    'Projects',
    'Sessions',
    'Skills',
  ]);
  for (const [full, methods] of services) {
    const name = full.slice('fwai.v1.'.length);
    const text = fs.readFileSync(path.join(GENERATED, `${name}.ts`), 'utf8');
    assert.match(text, new RegExp(`export interface ${name}Client extends grpc\\.Client`));
    for (const m of Object.keys(methods)) assert.match(text, new RegExp(`^  ${m}\\(`, 'm'), `${name}.${m}`);
  }
});
