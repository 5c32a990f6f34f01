#!/usr/bin/env bash
# clients/typescript/test.sh: what CI runs for the TypeScript client and
# executor SDK: install the pinned dependencies (npm ci, skipped when
# node_modules is current; npm's cache makes a reinstall offline), compile
# with tsc, link the examples to the package, and run the tests with
# Node's test runner: unit tests, then the client and the example executor
# pool against one real `planex dev`.
#
#   PLANEX_BINARY=/path/to/planex clients/typescript/test.sh
#
# Without PLANEX_BINARY the tests build ./cmd/planex once (go build).
# The executor conformance suite runs apart, in Go, after this script has
# compiled the SDK and linked the examples:
#   go test -count=1 -run 'TestConformance/typescript' ./test/conformance/
set -euo pipefail
cd "$(dirname "$0")"
step() { printf '=== typescript: %s (%ds)\n' "$*" "$SECONDS" >&2; }

step "npm ci"
./install.sh
step "tsc"
rm -rf dist
node_modules/.bin/tsc -p tsconfig.json
step "examples"
for ex in ../../examples/typescript-executor ../../examples/typescript-client; do
  (cd "$ex" && npm ci --prefer-offline --no-audit --no-fund --loglevel=error >/dev/null)
done
step "node --test"
node --test --test-concurrency=1 dist/test/
step "done"
