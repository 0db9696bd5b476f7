// Compile-time checks of the typed client (run by `npm run typecheck`): the
// service, method, request and response of every call come from the types
// generated from the protos, so a wrong name or field does not compile. Each
// line marked as an expected error fails the typecheck when it compiles.
import type { FwaiClient } from '../../src/client/connection';
import type { BidiMethod, ServerStreamMethod, UnaryMethod, UnaryRequest, UnaryResponse } from '../../src/client/rpc';

type Eq<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
function same<A, B>(ok: Eq<A, B>): Eq<A, B> {
  return ok;
}

// The RPCs of a service, by kind, as the protos declare them.
same<
  UnaryMethod<'Hardware'>,
  | 'ListDevices'
  | 'Acquire'
  | 'Renew'
  | 'Release'
  | 'Debug'
  | 'Reset'
  | 'SetHealth'
  | 'SelfTest'
  | 'Who'
  | 'AddWatch'
  | 'ListWatches'
  | 'RemoveWatch'
>(true);
same<ServerStreamMethod<'Hardware'>, 'Hold' | 'Flash'>(true);
same<BidiMethod<'Hardware'>, 'Serial'>(true);
same<
  UnaryMethod<'Sessions'>,
  | 'Create'
  | 'List'
  | 'Get'
  | 'Delete'
  | 'History'
  | 'ListCheckpoints'
  | 'Rewind'
  | 'ReadCheckpointFile'
  | 'Share'
  | 'Unshare'
>(true);
same<ServerStreamMethod<'Sessions'>, 'Attach'>(true);
same<BidiMethod<'Sessions'>, 'Chat'>(true);
// 64-bit integers are numbers in answers (longs: Number); requests take what proto-loader accepts.
same<UnaryResponse<'Hardware', 'Acquire'>['expires_us'], number>(true);
same<UnaryRequest<'Hardware', 'Acquire'>['device_id'], string | undefined>(true);

export async function checks(client: FwaiClient): Promise<void> {
  const lease = await client.call('Hardware', 'Acquire', { device_id: 'b', ttl_s: 60 });
  const expires: number = lease.expires_us;
  const id: string = lease.lease_id;
  // @ts-expect-error: the answer has no such field
  void lease.expires;
  // @ts-expect-error: no such RPC
  await client.call('Hardware', 'Acquir', {});
  // @ts-expect-error: the RPC is another service's
  await client.call('Sessions', 'ListDevices', {});
  // @ts-expect-error: no such service
  await client.call('Boards', 'ListDevices', {});
  // @ts-expect-error: a streaming RPC is not called as a unary one
  await client.call('Hardware', 'Flash', {});
  // @ts-expect-error: no such field in the request
  await client.call('Hardware', 'Acquire', { device: 'b' });
  // @ts-expect-error: a field of the wrong type
  await client.call('Hardware', 'Acquire', { device_id: 1 });

  const flash = await client.serverStream('Hardware', 'Flash', { device_id: 'b', image_path: '/x.elf' });
  flash.on('data', (p) => {
    const fraction: number = p.fraction;
    void fraction;
  });
  // @ts-expect-error: a unary RPC is not a stream
  await client.serverStream('Hardware', 'Acquire', {});

  const chat = await client.bidi('Sessions', 'Chat');
  chat.write({ open: { session_id: 's', after_seq: 0, replay: true } });
  // @ts-expect-error: ClientEvent has no such member
  chat.write({ opne: { session_id: 's' } });
  void [expires, id];
}
