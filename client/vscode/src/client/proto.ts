// Loads fwaid's API (proto/fwai/v1) at run time with proto-loader.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import * as fs from 'node:fs';
import * as path from 'node:path';

export const PROTO_FILES = [
  'fwai/v1/common.proto',
  'fwai/v1/events.proto',
  'fwai/v1/sessions.proto',
  'fwai/v1/daemon.proto',
  'fwai/v1/hardware.proto',
  'fwai/v1/projects.proto',
  'fwai/v1/knowledge.proto',
  'fwai/v1/evidence.proto',
  'fwai/v1/firmware.proto',
  'fwai/v1/ota.proto',
];

// snake_case field names as in the protos (and the CLI's --json), 64-bit
// integers as numbers (seq and microsecond times stay below 2^53), enums as
// names, unset scalars as their defaults, and the name of the set oneof member.
export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
};

export type FwaiPackage = Record<string, grpc.ServiceClientConstructor>;

const cache = new Map<string, FwaiPackage>();

/** `protoRoot` holds fwai/v1/*.proto. */
export function loadFwaiPackage(protoRoot: string): FwaiPackage {
  const hit = cache.get(protoRoot);
  if (hit) return hit;
  for (const f of PROTO_FILES) {
    if (!fs.existsSync(path.join(protoRoot, f))) throw new Error(`fwai API: ${path.join(protoRoot, f)} is missing`);
  }
  const def = protoLoader.loadSync(PROTO_FILES, { ...LOADER_OPTIONS, includeDirs: [protoRoot] });
  const loaded = grpc.loadPackageDefinition(def) as unknown as { fwai: { v1: FwaiPackage } };
  cache.set(protoRoot, loaded.fwai.v1);
  return loaded.fwai.v1;
}
