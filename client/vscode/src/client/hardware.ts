// Boards and other devices (the Hardware service, as `fwai hw` shows them):
// the list with health, holder and leases; leases taken, renewed and
// released; a board's self-test; an image flashed, with the daemon's progress
// (its flash guard decides, and its refusal names the rule).
import type { Device__Output } from '../generated/fwai/v1/Device';
import type { FlashProgress__Output } from '../generated/fwai/v1/FlashProgress';
import type { Lease__Output } from '../generated/fwai/v1/Lease';
import type { ListDevicesResponse__Output } from '../generated/fwai/v1/ListDevicesResponse';
import { FwaiClient } from './connection';
import { toFwaiError } from './errors';

export type Device = Device__Output;
export type Lease = Lease__Output;
export type FlashProgress = FlashProgress__Output;
/** The devices, the leases held on them, and why a lab's registry could not be read (when it could not). */
export type DeviceList = ListDevicesResponse__Output;

/** One thing a terminal can read of a board: its UART, or an RTT up-channel. */
export interface StreamChoice {
  /** As SerialOpen.stream takes it: "uart" or "rtt:N". */
  stream: string;
  label: string;
  description: string;
}

/**
 * What can be read of `d`, the UART first: its semihosting console and RTT
 * channels as the daemon lists them (named as the firmware names them). A board whose channels are
 * not known (its firmware not running yet, a bench too old to say) has the
 * UART only.
 */
export function streamChoices(d: Device): StreamChoice[] {
  const out: StreamChoice[] = [{ stream: 'uart', label: 'UART', description: 'the serial port' }];
  for (const s of d.streams ?? []) {
    if (s.id === 'semihosting') {
      out.push({ stream: s.id, label: 'Semihosting', description: "the firmware's semihosting console" });
      continue;
    }
    const m = /^rtt:(\d+)$/.exec(s.id);
    if (!m) continue;
    out.push({
      stream: s.id,
      label: `RTT ${m[1]}${s.name ? ` · ${s.name}` : ''}`,
      description: `SEGGER RTT up-channel ${m[1]}, read while the firmware runs`,
    });
  }
  return out;
}

export function listDevices(client: FwaiClient): Promise<DeviceList> {
  return client.call('Hardware', 'ListDevices', {});
}

/**
 * Leases `deviceId` for `ttlS` seconds (0: the daemon's default). With
 * `waitS`, waits that long for a board someone else holds; without, a held
 * board is refused at once.
 */
export function acquireLease(
  client: FwaiClient,
  deviceId: string,
  o: { ttlS?: number; waitS?: number } = {},
): Promise<Lease> {
  const waitS = o.waitS ?? 0;
  return client.call(
    'Hardware',
    'Acquire',
    { device_id: deviceId, ttl_s: o.ttlS ?? 0, wait_s: waitS },
    (waitS + 30) * 1000,
  );
}

/** Renews a lease for its TTL again; answers it with its new expiry. */
export function renewLease(client: FwaiClient, leaseId: string): Promise<Lease> {
  return client.call('Hardware', 'Renew', { lease_id: leaseId });
}

/** Releases the lease `leaseId`, or the caller's lease on `deviceId`. */
export async function releaseLease(client: FwaiClient, o: { leaseId?: string; deviceId?: string }): Promise<void> {
  await client.call('Hardware', 'Release', { lease_id: o.leaseId ?? '', device_id: o.deviceId ?? '' });
}

/** Runs the board's self-test; answers its report (for people). */
export async function selfTest(client: FwaiClient, deviceId: string, timeoutMs = 300000): Promise<string> {
  const r = await client.call('Hardware', 'SelfTest', { device_id: deviceId }, timeoutMs);
  return r.report;
}

export interface FlashOptions {
  deviceId: string;
  /** The ELF or binary to write. */
  imagePath: string;
  /** The person approved this flash. */
  approved: boolean;
  /** The caller's lease on the board ('' : none, and the guard refuses). */
  leaseId?: string;
  /** Sources newer than the image refuse the flash (default: found above the image). */
  projectRoot?: string;
}

/**
 * Flashes an image; `onProgress` sees every stage. Resolves with the last
 * progress (the image's sha256, the boot line); rejects with a FwaiError
 * carrying the daemon's message, the guard's rule when it refused.
 */
export async function flashImage(
  client: FwaiClient,
  o: FlashOptions,
  onProgress: (p: FlashProgress) => void = () => {},
): Promise<FlashProgress | null> {
  const stream = await client.serverStream('Hardware', 'Flash', {
    device_id: o.deviceId,
    image_path: o.imagePath,
    approved: o.approved,
    lease_id: o.leaseId ?? '',
    project_root: o.projectRoot ?? '',
  });
  let last: FlashProgress | null = null;
  return new Promise((resolve, reject) => {
    stream.on('data', (p: FlashProgress) => {
      last = p;
      onProgress(p);
    });
    stream.on('end', () => resolve(last));
    stream.on('error', (e: unknown) => reject(toFwaiError(e)));
  });
}

/**
 * Captures the board's stopped core through the daemon (`capture`: registers,
 * fault status, RAM, the serial lines before, tied to the image's sha256).
 * Answers the capture (the file `fwai fault decode` reads); rejects with what
 * the daemon said when none was taken.
 */
export async function captureFault(
  client: FwaiClient,
  deviceId: string,
  leaseId = '',
  timeoutMs = 60000,
): Promise<Record<string, unknown>> {
  const r = await client.call(
    'Hardware',
    'Debug',
    { device_id: deviceId, lease_id: leaseId, commands: ['capture'], timeout_s: 30 },
    timeoutMs,
  );
  const results = JSON.parse(r.result_json || '[]') as Array<Record<string, unknown>>;
  const entry = results.find((e) => e && typeof e === 'object' && 'capture' in e);
  if (!entry) throw new Error(`no capture of ${deviceId}: ${r.outputs?.[0] ?? 'the daemon took none'}`);
  return entry.capture as Record<string, unknown>;
}
