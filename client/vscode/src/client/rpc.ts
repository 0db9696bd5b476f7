// fwaid's services as the types generated from proto/fwai/v1 describe them
// (src/generated, made by scripts/gen-types.mjs at build time): which RPCs
// each service has, what each takes and what it answers. FwaiClient's call,
// serverStream and bidi take their service, method, request and response
// types from here, so a wrong method name or field does not compile.
import type * as grpc from '@grpc/grpc-js';
import type { DaemonClient } from '../generated/fwai/v1/Daemon';
import type { EvidenceClient } from '../generated/fwai/v1/Evidence';
import type { FirmwareClient } from '../generated/fwai/v1/Firmware';
import type { HardwareClient } from '../generated/fwai/v1/Hardware';
import type { KnowledgeClient } from '../generated/fwai/v1/Knowledge';
import type { OtaClient } from '../generated/fwai/v1/Ota';
import type { ProjectsClient } from '../generated/fwai/v1/Projects';
import type { SessionsClient } from '../generated/fwai/v1/Sessions';
import type { SkillsClient } from '../generated/fwai/v1/Skills';

/** The services the client speaks (their protos are in PROTO_FILES), by name. */
export interface ServiceClients {
  Sessions: SessionsClient;
  Daemon: DaemonClient;
  Hardware: HardwareClient;
  Skills: SkillsClient;
  Projects: ProjectsClient;
  Knowledge: KnowledgeClient;
  Evidence: EvidenceClient;
  Firmware: FirmwareClient;
  Ota: OtaClient;
}
export type ServiceName = keyof ServiceClients;

// The generated client has each RPC twice (Acquire and acquire), each with
// overloads; a conditional type matches the last overload. What it returns
// tells the kinds apart (a duplex stream is also a readable one, so it is
// asked first), its parameters give the request and the response.
type Kind<F> = F extends (...args: any[]) => infer R
  ? R extends grpc.ClientDuplexStream<any, any>
    ? 'bidi'
    : R extends grpc.ClientReadableStream<any>
      ? 'serverStream'
      : R extends grpc.ClientWritableStream<any>
        ? 'clientStream'
        : R extends grpc.ClientUnaryCall
          ? 'unary'
          : never
  : never;
type UnarySig<F> =
  Kind<F> extends 'unary'
    ? F extends (argument: infer Req, callback: grpc.requestCallback<infer Resp>) => grpc.ClientUnaryCall
      ? [Req, Resp]
      : never
    : never;
type ServerStreamSig<F> =
  Kind<F> extends 'serverStream'
    ? F extends (argument: infer Req, options?: grpc.CallOptions) => grpc.ClientReadableStream<infer Resp>
      ? [Req, Resp]
      : never
    : never;
type BidiSig<F> =
  Kind<F> extends 'bidi'
    ? F extends (options?: grpc.CallOptions) => grpc.ClientDuplexStream<infer Req, infer Resp>
      ? [Req, Resp]
      : never
    : never;

/** The proto's spelling of an RPC (capitalised), not the camelCase alias. */
type RpcName<S extends ServiceName> =
  Extract<keyof ServiceClients[S], string> extends infer K
    ? K extends string
      ? K extends Capitalize<K>
        ? K
        : never
      : never
    : never;
type Rpc<S extends ServiceName, M> = ServiceClients[S][M & keyof ServiceClients[S]];

export type UnaryMethod<S extends ServiceName> = {
  [K in RpcName<S>]: [UnarySig<Rpc<S, K>>] extends [never] ? never : K;
}[RpcName<S>];
export type ServerStreamMethod<S extends ServiceName> = {
  [K in RpcName<S>]: [ServerStreamSig<Rpc<S, K>>] extends [never] ? never : K;
}[RpcName<S>];
export type BidiMethod<S extends ServiceName> = {
  [K in RpcName<S>]: [BidiSig<Rpc<S, K>>] extends [never] ? never : K;
}[RpcName<S>];

/** What a unary RPC takes (the permissive input type: unset fields are their defaults). */
export type UnaryRequest<S extends ServiceName, M extends UnaryMethod<S>> = UnarySig<Rpc<S, M>>[0];
/** What a unary RPC answers (the `__Output` type: every scalar set, as proto-loader's defaults give it). */
export type UnaryResponse<S extends ServiceName, M extends UnaryMethod<S>> = UnarySig<Rpc<S, M>>[1];
export type ServerStreamRequest<S extends ServiceName, M extends ServerStreamMethod<S>> = ServerStreamSig<Rpc<S, M>>[0];
export type ServerStreamResponse<S extends ServiceName, M extends ServerStreamMethod<S>> = ServerStreamSig<
  Rpc<S, M>
>[1];
export type BidiRequest<S extends ServiceName, M extends BidiMethod<S>> = BidiSig<Rpc<S, M>>[0];
export type BidiResponse<S extends ServiceName, M extends BidiMethod<S>> = BidiSig<Rpc<S, M>>[1];
