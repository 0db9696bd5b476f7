#!/usr/bin/env bash
# Installs what the real-VS-Code suite needs, offline except for Debian's apt
# repositories and the npm registry, idempotently:
#   - Debian packages: chromium (the browser playwright-core drives), ripgrep,
#     and what code-server's native modules build with;
#   - code-server (VS Code's server and web workbench) from npm, into
#     $FWAI_E2E_CACHE/cs (default: <repo>/.cache/vscode-e2e).
# Re-runs skip finished steps (about a second).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
CACHE="${FWAI_E2E_CACHE:-$ROOT/.cache/vscode-e2e}"
CS_VERSION=4.100.3  # VS Code 1.100.3; the newest code-server whose engines accept Node 20
# code-server 4.100.3 -> lib/vscode pins @vscode/ripgrep 1.15.11, which fetches this asset.
RG_PKG_VERSION=1.15.11
RG_ASSET=ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz

log() { echo "[e2e-setup] $*" >&2; }
mkdir -p "$CACHE"

PKGS=(build-essential python3 libkrb5-dev ripgrep chromium fonts-dejavu-core)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${missing[@]}" >"$CACHE/apt.log" 2>&1 ||
    { tail -30 "$CACHE/apt.log" >&2; exit 1; }
fi

# node-gyp must use the installed Node headers instead of downloading them.
if [ -f /usr/include/node/node_api.h ]; then export npm_config_nodedir=/usr; fi

CS_DIR="$CACHE/cs"
CS_BIN="$CS_DIR/node_modules/.bin/code-server"
RG_BIN="$CS_DIR/node_modules/code-server/lib/vscode/node_modules/@vscode/ripgrep/bin/rg"
installed_version() { node -p 'require(process.argv[1]).version' "$CS_DIR/node_modules/code-server/package.json" 2>/dev/null || true; }
if ! { [ -x "$CS_BIN" ] && [ -x "$RG_BIN" ] && [ "$(installed_version)" = "$CS_VERSION" ]; }; then
  log "npm install code-server@$CS_VERSION (about 70 s on 2 cores)"
  # @vscode/ripgrep's postinstall downloads rg from GitHub unless its cache has
  # the asset: seed the cache with Debian's rg.
  RG_CACHE="$(node -p 'require("os").tmpdir()')/vscode-ripgrep-cache-$RG_PKG_VERSION"
  mkdir -p "$RG_CACHE" "$CACHE/rgpack"
  cp /usr/bin/rg "$CACHE/rgpack/rg"
  tar -C "$CACHE/rgpack" -czf "$RG_CACHE/$RG_ASSET" rg
  rm -rf "$CS_DIR"
  mkdir -p "$CS_DIR"
  echo '{"name":"fwai-code-server-host","private":true}' >"$CS_DIR/package.json"
  # As root, code-server's postinstall needs unsafe_perm; node-pty's postinstall
  # runs npx, which needs yes=true without a terminal.
  (cd "$CS_DIR" && npm_config_unsafe_perm=true npm_config_yes=true \
    npm install --no-audit --no-fund --foreground-scripts "code-server@$CS_VERSION") \
    >"$CACHE/cs-install.log" 2>&1 || { tail -40 "$CACHE/cs-install.log" >&2; exit 1; }
fi
echo "$CS_BIN"
