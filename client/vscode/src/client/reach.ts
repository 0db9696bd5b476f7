// Why a tcp:/tls: daemon gives no gRPC connection, in words that say what to
// change (the same probe as the CLI's, client/lib/reach.h). Run only after a
// connection failed: one TCP connect and, for tls:, one TLS handshake checked
// as gRPC checks it (the CA of fwai.caFile, else the system's; the host
// name), then a wait for fwaid's first bytes (a daemon that wants a client
// certificate says so only then).
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as tls from 'node:tls';
import { DaemonAddress } from './address';

/** What failed, for the connection state a UI shows. */
export type UnreachableKind =
  | 'unresolved'
  | 'refused'
  | 'timeout'
  | 'untrusted'
  | 'wrong-host'
  | 'client-certificate'
  | 'not-tls'
  | 'handshake';

export interface Unreachable {
  kind: UnreachableKind;
  message: string;
}

export interface ProbeFiles {
  caFile?: string;
  certFile?: string;
  keyFile?: string;
}

const UNTRUSTED = new Set([
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_SIGNATURE_FAILURE',
  'CERT_UNTRUSTED',
  'CERT_REJECTED',
  'INVALID_CA',
]);

function readOrUndefined(file: string | undefined): Buffer | undefined {
  if (!file) return undefined;
  try {
    return fs.readFileSync(file);
  } catch {
    return undefined;
  }
}

/** Null when the probe finds nothing wrong (or for a unix socket). */
export function whyUnreachable(addr: DaemonAddress, files: ProbeFiles, timeoutMs: number): Promise<Unreachable | null> {
  if (addr.kind === 'unix') return Promise.resolve(null);
  const where = `${addr.host}:${addr.port}`;
  const caSaid = files.caFile ? `the CA in ${files.caFile} (fwai.caFile)` : "the system's CAs (fwai.caFile is not set)";
  return new Promise((resolve) => {
    let done = false;
    let socket: net.Socket;
    const finish = (r: Unreachable | null) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(r);
    };
    const timer = setTimeout(
      () =>
        finish({
          kind: 'timeout',
          message: `${where} did not answer within ${timeoutMs} ms (the host is down, or a firewall drops the connection)`,
        }),
      timeoutMs,
    );
    const onError = (e: NodeJS.ErrnoException) => {
      const code = String(e.code ?? '');
      if (code === 'ECONNREFUSED') {
        return finish({
          kind: 'refused',
          message: `nothing listens at ${where} (connection refused): is fwaid running there, with a listener on that port?`,
        });
      }
      if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') {
        return finish({ kind: 'unresolved', message: `the host name ${addr.host} does not resolve (${code})` });
      }
      if (code === 'ERR_TLS_CERT_ALTNAME_INVALID') {
        return finish({
          kind: 'wrong-host',
          message: `fwaid's certificate at ${where} is not issued for ${addr.host}: connect by a name it names (see \`fwaid tls init --host\`)`,
        });
      }
      if (UNTRUSTED.has(code)) {
        return finish({
          kind: 'untrusted',
          message: `fwaid answered at ${where}, but its certificate is not trusted by ${caSaid}: ${e.message}. Set fwai.caFile to the CA that issued fwaid's certificate`,
        });
      }
      if (/CERTIFICATE_REQUIRED|certificate required/i.test(`${code} ${e.message}`)) {
        return finish({
          kind: 'client-certificate',
          message: `fwaid at ${where} asks for a client certificate: set fwai.clientCertFile and fwai.clientKeyFile`,
        });
      }
      if (/WRONG_VERSION_NUMBER|packet length too long/i.test(`${code} ${e.message}`)) {
        return finish({ kind: 'not-tls', message: `${where} does not speak TLS (a tcp: listener? use tcp:${where})` });
      }
      finish({
        kind: 'handshake',
        message: `the ${addr.kind === 'tls' ? 'TLS ' : ''}connection to ${where} failed: ${e.message}`,
      });
    };
    if (addr.kind === 'tcp') {
      socket = net.connect({ host: addr.host, port: addr.port }, () => finish(null));
    } else {
      socket = tls.connect(
        {
          host: addr.host,
          port: addr.port,
          servername: net.isIP(addr.host) ? undefined : addr.host,
          ca: readOrUndefined(files.caFile),
          cert: readOrUndefined(files.certFile),
          key: readOrUndefined(files.keyFile),
          ALPNProtocols: ['h2'],
        },
        // fwaid speaks first (HTTP/2 settings); a refusal of the client's
        // certificate comes as an alert instead.
        () => socket.once('data', () => finish(null)),
      );
    }
    socket.on('error', onError);
    socket.on('end', () => finish(null));
  });
}
