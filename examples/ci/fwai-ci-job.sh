#!/usr/bin/env bash
# A CI job that has nothing but the fwai CLI (fwai and fwaid on PATH, or in
# FWAI_BIN): it builds the firmware here, flashes a board of the lab, checks
# its boot line and prints the run's JSON summary on stdout.
#
# The job's own fwaid is a front of the lab: the script writes a fwaid.yaml
# with the lab's etcd endpoints and this runner's node certificate into a
# private XDG directory, and the first `fwai` command starts that fwaid
# (auto-start); it is stopped when the job ends. The board is leased by tag
# anywhere in the lab for the run (waiting for a free one) and released after.
#
#   FWAI_LAB_ETCD     the lab's etcd endpoints, comma-separated (required)
#                     e.g. https://10.0.0.5:2379,https://10.0.0.6:2379
#   FWAI_NODE         this runner's node name (default ci-runner); its node
#   FWAI_NODE_CERT    certificate (from `fwaid tls issue CA_DIR --node NODE`,
#   FWAI_NODE_KEY     an etcd user by deploy/lab-etcd-auth add-node NODE), its
#   FWAI_LAB_CA       key, and the lab's CA (required); the same certificate
#                     reaches etcd and the benches
#   FWAI_BOARD_TAG    the boards to use (default stm32f1; KEY or KEY:VALUE)
#   FWAI_BOARD_WAIT   seconds to wait for a free board (default 600)
#   FWAI_PROJECT      the firmware project (default: the current directory)
#   FWAI_BIN          where fwai and fwaid are (default: PATH)
#   FWAI_JOB_DIR      the job's fwaid state (default: a new temp dir, removed)
#
# Extra arguments go to `fwai run` (e.g. --var BOOT_PATTERN=...).
#
# Exit code: fwai run's — 0 ok; 10 a step failed; 11 config; 12 build;
# 13 flash; 14 verify (the boot line was not seen); 15 test; 16 policy;
# 17 timeout; 18 hardware (no board with the tag within FWAI_BOARD_WAIT, lease
# lost); 19 provider; 20 interrupted; 130 cancelled; 3 fwaid unreachable;
# 2 this script's own configuration is incomplete.
set -uo pipefail

die() { echo "fwai-ci-job: $*" >&2; exit 2; }
for v in FWAI_LAB_ETCD FWAI_NODE_CERT FWAI_NODE_KEY FWAI_LAB_CA; do
  [ -n "${!v:-}" ] || die "$v is not set"
done
for f in "$FWAI_NODE_CERT" "$FWAI_NODE_KEY" "$FWAI_LAB_CA"; do
  [ -r "$f" ] || die "cannot read $f"
done
NODE="${FWAI_NODE:-ci-runner}"
TAG="${FWAI_BOARD_TAG:-stm32f1}"
WAIT="${FWAI_BOARD_WAIT:-600}"
PROJECT="${FWAI_PROJECT:-.}"
FWAI=fwai
if [ -n "${FWAI_BIN:-}" ]; then
  FWAI="$FWAI_BIN/fwai"
  export PATH="$FWAI_BIN:$PATH"   # the auto-started fwaid is found next to fwai, else on PATH
fi
command -v "$FWAI" >/dev/null || die "fwai not found (set FWAI_BIN)"

if [ -n "${FWAI_JOB_DIR:-}" ]; then
  JOB="$FWAI_JOB_DIR"
  mkdir -p "$JOB"
else
  JOB="$(mktemp -d "${TMPDIR:-/tmp}/fwai-ci.XXXXXX")"
fi
# The job's fwaid: its socket, data and config in the job's own directories.
export XDG_RUNTIME_DIR="$JOB/run" XDG_DATA_HOME="$JOB/data" XDG_CONFIG_HOME="$JOB/config"
mkdir -p "$XDG_RUNTIME_DIR" "$XDG_DATA_HOME" "$XDG_CONFIG_HOME/fwai"
chmod 0700 "$XDG_RUNTIME_DIR"
unset FWAI_DAEMON
ENDPOINTS=$(echo "$FWAI_LAB_ETCD" | sed 's/,/, /g')
cat > "$XDG_CONFIG_HOME/fwai/fwaid.yaml" <<YAML
# A front of the lab for one CI job: no boards of its own.
lab:
  etcd: [$ENDPOINTS]
  node: $NODE
  cert: $FWAI_NODE_CERT
  key: $FWAI_NODE_KEY
  ca: $FWAI_LAB_CA
hardware:
  default_simulated_board: false
YAML

finish() {
  "$FWAI" daemon stop >/dev/null 2>&1 || true
  [ -n "${FWAI_JOB_DIR:-}" ] || rm -rf "$JOB"
}
trap finish EXIT

cd "$PROJECT" || die "no project at $PROJECT"
# `fwai run` would start it too; started here, a broken config is told as such.
if ! "$FWAI" daemon start >&2; then
  echo "fwai-ci-job: the job's fwaid did not start; its log:" >&2
  cat "$XDG_RUNTIME_DIR/fwai/fwaid.log" >&2 2>/dev/null
  exit 3
fi
"$FWAI" run build-flash-verify --ci --yes --board-tag "$TAG" --board-wait "$WAIT" "$@"
