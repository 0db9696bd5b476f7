#!/usr/bin/python3
"""Lease a board, flash an image, read its serial port until a pattern, release.

A client of fwaid's gRPC API (fwai.v1.Hardware) with nothing of fwai's own:
Debian's python3-grpcio and python3-protobuf, and stubs generated from
fwai's proto/ directory (the build makes them in build/python; see README.md
in this directory). Works against a local fwaid, a lab front or a shared lab
daemon alike.

    fwai_client.py --daemon unix:/run/user/1000/fwai/fwaid.sock \\
        --tag stm32f1 --image build/blinky.elf --until booted

Exit code: 0 the pattern was seen; 1 it was not (timeout, or the port went
away); 2 usage; 3 fwaid unreachable; 4 no board (lease refused or timed out);
5 the flash failed.
"""

import argparse
import os
import re
import sys
import threading
import time


def load_stubs(stubs_dir):
    if stubs_dir:
        sys.path.insert(0, stubs_dir)
    try:
        import grpc  # noqa: F401
    except ImportError:
        sys.exit("fwai_client: python3-grpcio is not installed (apt-get install python3-grpcio python3-protobuf)")
    try:
        from fwai.v1 import hardware_pb2, hardware_pb2_grpc  # noqa: F401
    except ImportError as e:
        sys.exit(f"fwai_client: no fwai stubs ({e}); give --stubs DIR (the build's build/python, "
                 "or generate them: see examples/python-client/README.md)")


def channel_for(args):
    import grpc
    call_creds = None
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            call_creds = grpc.access_token_call_credentials(f.read().strip())
    if args.daemon.startswith("unix:"):
        if call_creds:
            sys.exit("fwai_client: a token is for tcp: or tls: (the unix socket knows you by your uid)")
        return grpc.insecure_channel(args.daemon)
    if args.daemon.startswith("tls:"):
        def read(path):
            if not path:
                return None
            with open(path, "rb") as f:
                return f.read()
        creds = grpc.ssl_channel_credentials(read(args.ca_cert), read(args.client_key), read(args.client_cert))
        target = args.daemon[4:]
    elif args.daemon.startswith("tcp:"):
        # fwaid serves plain TCP on loopback only, as a local connection.
        creds = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
        target = args.daemon[4:]
    else:
        sys.exit(f"fwai_client: --daemon {args.daemon}: expected unix:PATH, tcp:HOST:PORT or tls:HOST:PORT")
    if call_creds:
        creds = grpc.composite_channel_credentials(creds, call_creds)
    return grpc.secure_channel(target, creds)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--daemon", default=os.environ.get("FWAI_DAEMON", ""),
                   help="unix:PATH, tcp:HOST:PORT or tls:HOST:PORT (default: $FWAI_DAEMON)")
    p.add_argument("--ca-cert", help="tls: the CA of fwaid's certificate")
    p.add_argument("--client-cert", help="tls: your client certificate (mutual TLS)")
    p.add_argument("--client-key", help="tls: its key")
    p.add_argument("--token-file", help="tcp:/tls: a file holding your fwai token")
    p.add_argument("--stubs", default=os.environ.get("FWAI_PY_STUBS", ""),
                   help="where the generated fwai/v1/*_pb2*.py are (default: $FWAI_PY_STUBS)")
    p.add_argument("--board", default="", help="the board's id")
    p.add_argument("--tag", action="append", default=[], help="any free board with this tag (KEY or KEY:VALUE)")
    p.add_argument("--wait", type=int, default=0, help="seconds to wait for a free board")
    p.add_argument("--ttl", type=int, default=60, help="the lease's TTL in seconds (renewed while this runs)")
    p.add_argument("--image", required=True, help="the image to flash (read by fwaid as your account)")
    p.add_argument("--project-root", default="",
                   help="the image's project: fwaid refuses an image older than its sources "
                        "(default: the project fwaid finds above the image)")
    p.add_argument("--until", required=True, help="a regular expression to wait for on the serial port")
    p.add_argument("--send", default="", help="a line to send once the stream is open")
    p.add_argument("--timeout", type=float, default=30, help="seconds to wait for --until after the flash")
    args = p.parse_args()
    if not args.daemon:
        p.error("--daemon (or FWAI_DAEMON) is required")
    if not args.board and not args.tag:
        p.error("give --board or --tag")
    try:
        pattern = re.compile(args.until)
    except re.error as e:
        p.error(f"--until: {e}")
    load_stubs(args.stubs)
    import grpc
    from fwai.v1 import common_pb2, hardware_pb2, hardware_pb2_grpc

    channel = channel_for(args)
    try:
        grpc.channel_ready_future(channel).result(timeout=10)
    except grpc.FutureTimeoutError:
        print(f"fwai_client: cannot reach fwaid at {args.daemon}", file=sys.stderr)
        return 3
    hw = hardware_pb2_grpc.HardwareStub(channel)

    # The lease: held by a Hold stream, which fwaid renews while it is open
    # and releases the moment it ends (here, or if this process dies).
    req = hardware_pb2.AcquireRequest(device_id=args.board, ttl_s=args.ttl, wait_s=args.wait)
    for t in args.tag:
        key, _, value = t.partition(":")
        req.tags.append(common_pb2.Tag(key=key, value=value))
    hold = hw.Hold(req)
    try:
        lease = next(hold)
    except grpc.RpcError as e:
        print(f"fwai_client: no board: {e.code().name}: {e.details()}", file=sys.stderr)
        return 4
    board = lease.device_id
    where = f" on node {lease.node}" if lease.node else ""
    print(f"leased {board}{where} (lease {lease.lease_id}, ttl {lease.ttl_s} s)", flush=True)
    # Drain the hold stream in the background (it ends when we cancel it).
    def drain_hold():
        try:
            for _ in hold:
                pass
        except grpc.RpcError:
            pass
    drain = threading.Thread(target=drain_hold, daemon=True)
    drain.start()
    try:
        return work(hw, hardware_pb2, board, lease.lease_id, args, pattern)
    finally:
        hold.cancel()
        drain.join(timeout=5)
        print(f"released {board}", flush=True)


def work(hw, hardware_pb2, board, lease_id, args, pattern):
    import grpc

    # Serial first, so nothing the new image prints is missed; lines are
    # read by a thread into `lines`.
    cond = threading.Condition()
    pending = [hardware_pb2.SerialClientMessage(open=hardware_pb2.SerialOpen(device_id=board, lease_id=lease_id))]
    state = {"lines": [], "ended": None, "opened": False, "closing": False}

    def requests():
        while True:
            with cond:
                cond.wait_for(lambda: pending or state["closing"])
                if state["closing"] and not pending:
                    return
                msg = pending.pop(0)
            yield msg

    serial = hw.Serial(requests())

    def read():
        try:
            for m in serial:
                with cond:
                    if m.opened:
                        state["opened"] = True
                    state["lines"].extend(line.line for line in m.lines)
                    if m.error:
                        print(f"fwai_client: write refused: {m.error}", file=sys.stderr)
                    if m.end_of_stream:
                        state["ended"] = m.reason or "the port went away"
                    cond.notify_all()
        except grpc.RpcError as e:
            with cond:
                if not state["closing"]:
                    state["ended"] = f"{e.code().name}: {e.details()}"
                cond.notify_all()
        with cond:
            if state["ended"] is None:
                state["ended"] = "the stream ended"
            cond.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with cond:
        if not cond.wait_for(lambda: state["opened"] or state["ended"], timeout=10) or not state["opened"]:
            print(f"fwai_client: serial of {board} did not open: {state['ended']}", file=sys.stderr)
            return 1
        before_flash = len(state["lines"])  # what the old image printed is not looked at

    try:
        done = None
        for prog in hw.Flash(hardware_pb2.FlashRequest(
                device_id=board, lease_id=lease_id, image_path=os.path.abspath(args.image), approved=True,
                project_root=os.path.abspath(args.project_root) if args.project_root else "")):
            print(f"  [{prog.stage}] {prog.message}", flush=True)
            if prog.done:
                done = prog
        if done is not None:
            print(f"flashed {board}: sha256 {done.image_sha256}, {done.seconds:.2f} s", flush=True)
    except grpc.RpcError as e:
        print(f"fwai_client: flash failed: {e.code().name}: {e.details()}", file=sys.stderr)
        return 5

    if args.send:
        with cond:
            pending.append(hardware_pb2.SerialClientMessage(send_line=args.send))
            cond.notify_all()
        print(f"> {args.send}", flush=True)

    deadline = time.monotonic() + args.timeout
    seen = before_flash
    try:
        while True:
            with cond:
                cond.wait_for(lambda: len(state["lines"]) > seen or state["ended"],
                              timeout=max(0, deadline - time.monotonic()))
                new, seen = state["lines"][seen:], len(state["lines"])
                ended = state["ended"]
            for line in new:
                print(f"  {line}", flush=True)
                if pattern.search(line):
                    print(f"matched: {line}", flush=True)
                    return 0
            if ended:
                print(f"fwai_client: serial of {board} ended: {ended}", file=sys.stderr)
                return 1
            if time.monotonic() >= deadline:
                print(f"fwai_client: '{args.until}' not seen on {board} within {args.timeout:g} s", file=sys.stderr)
                return 1
    finally:
        with cond:
            state["closing"] = True
            cond.notify_all()
        serial.cancel()
        reader.join(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
