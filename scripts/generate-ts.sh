#!/usr/bin/env bash
# scripts/generate-ts.sh: regenerate the TypeScript code of
# clients/typescript/src/gen from proto/ (buf.gen.ts.yaml). It installs the
# pinned protoc-gen-es first (clients/typescript/install.sh: npm ci, skipped
# when node_modules is current). The Go code is `go tool buf generate`
# (buf.gen.yaml). $PLANEX_BUF, when set, is the buf to run (CI: the same
# version's official binary, .ci/install-buf). CI runs this and fails on `git diff --exit-code
# clients/typescript/src/gen`.
set -euo pipefail
cd "$(dirname "$0")/.."
clients/typescript/install.sh
${PLANEX_BUF:-go tool buf} generate --template buf.gen.ts.yaml
