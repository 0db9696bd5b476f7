#!/usr/bin/env bash
# The real-VS-Code suite: installs code-server and Chromium when missing
# (scripts/install-code-server.sh), packages the extension as a .vsix, and
# runs e2e.test.mjs, which starts fwaid, the fake LLM service and code-server
# with the .vsix installed, drives the workbench in headless Chromium, and runs
# the extension-host suite (test/exthost) inside VS Code.
#
#   npm run e2e                     # the suite
#   FWAI_E2E_MEASURE=1 npm run e2e  # also the measurements (README figures)
#   FWAI_E2E_PROFILE=1 FWAI_NO_MINIFY=1 FWAI_E2E_MEASURE=1 npm run e2e
#                                   # and each measured turn's CPU profile and trace
#
# Artifacts: <repo>/build/vscode-e2e/ (screenshots/, logs, measurements.json).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EXT="$(cd "$HERE/.." && pwd)"
ROOT="$(cd "$EXT/../.." && pwd)"
export FWAI_BIN_DIR="${FWAI_BIN_DIR:-$ROOT/build/bin}"
for b in fwaid fwai fwai_fake_llm; do
  [ -x "$FWAI_BIN_DIR/$b" ] || { echo "e2e: $FWAI_BIN_DIR/$b is missing: build first (scripts/build)" >&2; exit 1; }
done
CS_BIN="$("$EXT/scripts/install-code-server.sh" | tail -1)"
cd "$EXT"
[ -d node_modules/playwright-core ] || npm ci --no-audit --no-fund
export E2E_OUT="${E2E_OUT:-$ROOT/build/vscode-e2e}"
mkdir -p "$E2E_OUT"
if ! { [ -f dist/extension.js ] && [ -f fwai-vscode.vsix ] && [ "${FWAI_E2E_REPACKAGE:-1}" = 0 ]; }; then
  npm run package >"$E2E_OUT/package.log" 2>&1 || { cat "$E2E_OUT/package.log" >&2; exit 1; }
fi
export CS_BIN VSIX="$EXT/fwai-vscode.vsix" CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
exec node --test --test-reporter=spec --test-concurrency=1 e2e/e2e.test.mjs
