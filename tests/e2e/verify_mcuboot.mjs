// An independent reader of MCUboot images, written from MCUboot's
// bootutil/image.h and docs/design.md (not from fwai's code), used by the
// tests to check what `fwai ota package` writes. Node's own crypto checks
// the SHA-256 TLV, the key hash and the Ed25519 signature over the digest.
//
//   node verify_mcuboot.mjs IMAGE PUBLIC_KEY.pem [--slot-size N]
// Prints a JSON report; exits 0 when the image is valid.
import { readFileSync } from 'node:fs';
import { createHash, createPublicKey, verify } from 'node:crypto';

const [file, keyFile, ...rest] = process.argv.slice(2);
const slotSize = rest[0] === '--slot-size' ? Number(rest[1]) : 0;
const b = readFileSync(file);
const report = { ok: false, errors: [] };
const fail = (msg) => { report.errors.push(msg); };

const IMAGE_MAGIC = 0x96f3b83d;
if (b.readUInt32LE(0) !== IMAGE_MAGIC) fail('ih_magic');
const hdrSize = b.readUInt16LE(8);
const protSize = b.readUInt16LE(10);
const imgSize = b.readUInt32LE(12);
report.version = `${b[20]}.${b[21]}.${b.readUInt16LE(22)}`;
const build = b.readUInt32LE(24);
if (build) report.version += `+${build}`;
report.header_size = hdrSize;
report.image_size = imgSize;
report.load_addr = b.readUInt32LE(4);
report.flags = b.readUInt32LE(16);

let off = hdrSize + imgSize;
report.tlvs = [];
const readArea = (magic, prot) => {
  if (b.readUInt16LE(off) !== magic) { fail(`TLV area magic at ${off}`); return; }
  const total = b.readUInt16LE(off + 2);
  let p = off + 4;
  while (p < off + total) {
    const type = b.readUInt16LE(p);
    const len = b.readUInt16LE(p + 2);
    report.tlvs.push({ type, len, prot, value: b.subarray(p + 4, p + 4 + len) });
    p += 4 + len;
  }
  if (p !== off + total) fail('TLV area length');
  off += total;
};
if (protSize) {
  const start = off;
  readArea(0x6908, true);
  if (off - start !== protSize) fail('ih_protect_tlv_size');
}
const hashed = b.subarray(0, off);
readArea(0x6907, false);

const digest = createHash('sha256').update(hashed).digest();
const tlv = (type) => report.tlvs.find((t) => t.type === type && !t.prot);
const sha = tlv(0x10);
report.hash_ok = !!sha && Buffer.compare(sha.value, digest) === 0;
if (!report.hash_ok) fail('SHA256 TLV');
const key = createPublicKey(readFileSync(keyFile));
const spki = key.export({ type: 'spki', format: 'der' });
const keyhash = tlv(0x01);
report.key_hash_ok = !!keyhash && Buffer.compare(keyhash.value, createHash('sha256').update(spki).digest()) === 0;
if (!report.key_hash_ok) fail('KEYHASH TLV');
const sig = tlv(0x24);
report.signature_ok = !!sig && sig.len === 64 && verify(null, digest, key, sig.value);
if (!report.signature_ok) fail('ED25519 TLV');
const seccnt = report.tlvs.find((t) => t.type === 0x50 && t.prot);
if (seccnt) report.security_counter = seccnt.value.readUInt32LE(0);

if (slotSize) {
  const magic = Buffer.from([0x77, 0xc2, 0x95, 0xf3, 0x60, 0xd2, 0xef, 0x7f, 0x35, 0x52, 0x50, 0x0f, 0x2c, 0xb6, 0x79, 0x80]);
  if (b.length !== slotSize) fail('slot size');
  report.trailer_magic_ok = Buffer.compare(b.subarray(b.length - 16), magic) === 0;
  if (!report.trailer_magic_ok) fail('trailer magic');
  report.image_ok = b[b.length - 24] === 0x01 ? 'set' : b[b.length - 24] === 0xff ? 'unset' : 'bad';
  report.erased_between = b.subarray(off, b.length - 48).every((x) => x === 0xff);
}
report.ok = report.errors.length === 0;
for (const t of report.tlvs) delete t.value;
console.log(JSON.stringify(report));
process.exit(report.ok ? 0 : 1);
