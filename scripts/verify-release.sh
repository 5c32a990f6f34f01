#!/usr/bin/env bash
# scripts/verify-release.sh dist/<VERSION>: check a `make release` output
# (CI runs it on a release built from the commit under test).
#
#   1. cmd/internal/release verify: SHA256SUMS covers every file and
#      matches; each binary is a static ELF for its architecture and the
#      host's prints the release's version and commit; each platform of the
#      image archive holds exactly that binary as /planex, runs as
#      65532:65532 with entrypoint /planex; the SBOMs are CycloneDX JSON of
#      planex and its modules; the chart and manifests name the digest.
#   2. helm lint --strict of the packaged chart (the pinned Helm of tools/helm).
#   3. tools/helm/manifests TestRelease: every overlay of the release's
#      manifests (and a kustomization of a user adding components/mcp-pool
#      to production), and the packaged chart with the CI values files,
#      render every planex container as <repository>@<the release's digest>.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# = 1 ] || { echo "usage: scripts/verify-release.sh dist/<VERSION>" >&2; exit 2; }
[ -f "$1/release.json" ] || { echo "verify-release: $1/release.json not found: not a release directory (make release VERSION=...)" >&2; exit 1; }
dir="$(cd "$1" && pwd)"
GO="${GO:-go}"

echo "=== verify-release: artefacts of $dir"
"$GO" run ./cmd/internal/release verify "$dir"

echo "=== verify-release: helm lint --strict"
charts=("$dir"/planex-*.tgz)
[ "${#charts[@]}" = 1 ] && [ -f "${charts[0]}" ] || { echo "verify-release: want exactly one planex-*.tgz in $dir" >&2; exit 1; }
(cd tools/helm && "$GO" tool helm lint --strict "${charts[0]}")

echo "=== verify-release: manifests and chart render the release's digest"
# The same test build as CI's manifests step (no -race: pure rendering), so one compiles for both.
(cd tools/helm && PLANEX_RELEASE_DIR="$dir" "$GO" test -count=1 -run '^TestRelease$' -v ./manifests/)
echo "verify-release: $dir ok"
