#!/usr/bin/env bash
# scripts/release.sh: build a planex release into dist/<VERSION>/
# (`make release VERSION=vX.Y.Z`). docs/releases.md describes the output,
# how to check it (scripts/verify-release.sh) and how to publish it.
#
#   VERSION=v0.2.0 [ARCHES="amd64 arm64"] [REGISTRY=ghcr.io/planex-dev/planex] scripts/release.sh
#
# Needs Go and podman (the image is built without running a container: the
# Dockerfile's `local` source only copies the binary onto scratch). Every
# artefact is reproducible: built from the same commit with the same Go and
# podman versions, two runs give byte-identical files (SHA256SUMS) and the
# same image digest. Timestamps are the commit's time (SOURCE_DATE_EPOCH).
#
# Environment:
#   VERSION       required, vMAJOR.MINOR.PATCH[-PRERELEASE]
#   ARCHES        Linux architectures (GOARCH names), default "amd64 arm64"
#   REGISTRY      repository the image will be pushed to (no tag/digest)
#   OUT           output directory, default dist/$VERSION (replaced)
#   ENGINE        podman (default); ENGINE_FLAGS are passed before its
#                 subcommand (e.g. --storage-driver vfs in a nested sandbox)
#   ALLOW_DIRTY=1 build from a work tree whose sources differ from HEAD
#                 (the artefacts then do not match the commit they name)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "release: $*" >&2; exit 1; }
step() { printf '\n=== release: %s (%ds)\n' "$*" "$SECONDS" >&2; }

VERSION="${VERSION:-}"
ARCHES="${ARCHES:-amd64 arm64}"
REGISTRY="${REGISTRY:-ghcr.io/planex-dev/planex}"
OUT="${OUT:-dist/$VERSION}"
ENGINE="${ENGINE:-podman}"
read -r -a engine_flags <<<"${ENGINE_FLAGS:-}"
GO="${GO:-go}"

# --- inputs -----------------------------------------------------------------
semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$'
[[ "$VERSION" =~ $semver ]] || die "VERSION=${VERSION:-<unset>}: want vMAJOR.MINOR.PATCH[-PRERELEASE], e.g. make release VERSION=v0.2.0"
[[ "$REGISTRY" =~ ^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+$ ]] ||
  die "REGISTRY=$REGISTRY: want an image repository without tag or digest, e.g. ghcr.io/planex-dev/planex"
read -r -a arches <<<"$ARCHES"
[ "${#arches[@]}" -gt 0 ] || die "ARCHES is empty: want Linux GOARCH names, e.g. ARCHES=\"amd64 arm64\""
for arch in "${arches[@]}"; do
  case "$arch" in
    amd64 | arm64 | ppc64le | s390x | riscv64) ;;
    *) die "ARCHES: $arch is not a supported architecture (amd64 arm64 ppc64le s390x riscv64)" ;;
  esac
  [ "$(printf '%s\n' "${arches[@]}" | grep -cx "$arch")" = 1 ] || die "ARCHES: $arch is listed twice"
done
case "$(basename "$ENGINE")" in
  podman) ;;
  *) die "ENGINE=$ENGINE: the release needs podman (multi-arch manifest lists and --timestamp); install it (apt-get install podman)" ;;
esac
command -v "$ENGINE" >/dev/null 2>&1 || die "$ENGINE is not installed (Debian: apt-get install podman)"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum is not installed (coreutils)"

COMMIT="$(git rev-parse HEAD)"
# The commit's time: every timestamp of every artefact.
SOURCE_DATE_EPOCH="$(git log -1 --format=%ct HEAD)"
export SOURCE_DATE_EPOCH
# What goes into an artefact must be the commit's.
dirty="$(git status --porcelain -- go.mod go.sum cmd gen internal services deploy Dockerfile Makefile scripts tools/release tools/helm/go.mod tools/helm/go.sum)"
if [ -n "$dirty" ]; then
  [ "${ALLOW_DIRTY:-}" = 1 ] || die "the work tree differs from $COMMIT in what the release is built from:
$dirty
commit or stash it, or pass ALLOW_DIRTY=1 for a test build"
  echo "release: ALLOW_DIRTY=1: building from a work tree that differs from $COMMIT" >&2
fi
if [ "$(git describe --tags --exact-match HEAD 2>/dev/null || true)" != "$VERSION" ]; then
  echo "release: note: HEAD is not tagged $VERSION (fine for a test build; tag it before publishing, docs/releases.md)" >&2
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/planex-release.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# podman keeps the release's images in a storage of their own, removed
# with $work: nothing is left in (or reused from) the machine's storage.
engine_flags+=(--root "$work/storage" --runroot "$work/runroot")
list="localhost/planex-release:$VERSION"

# Built in $work, moved to $OUT at the end: a failed build leaves no
# half-release behind, and only an earlier release is ever replaced.
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ] && [ ! -f "$OUT/release.json" ]; then
  die "OUT=$OUT exists and is not a release directory (no release.json): remove it or choose another OUT"
fi
final="$OUT"
OUT="$work/out"
mkdir -p "$OUT" "$work/ctx/bin"

step "release kit and SBOM tool"
"$GO" build -o "$work/release" ./cmd/internal/release
# Built with -trimpath: the SBOM records the tool's own hash, which must
# not depend on where the module cache is.
"$GO" build -C tools/release -trimpath -o "$work/cyclonedx-gomod" github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod

# --- binaries -----------------------------------------------------------------
# Static (no cgo), no local paths, no build ID or VCS stamp that could
# differ between machines, stamped with the version and commit.
ldflags="-s -w -buildid= -X main.version=$VERSION -X main.commit=$COMMIT"
for arch in "${arches[@]}"; do
  step "binary linux/$arch"
  CGO_ENABLED=0 GOOS=linux GOARCH="$arch" "$GO" build -trimpath -buildvcs=false -ldflags "$ldflags" \
    -o "$OUT/planex-linux-$arch" ./cmd/planex
  mkdir -p "$work/ctx/bin/linux-$arch"
  cp "$OUT/planex-linux-$arch" "$work/ctx/bin/linux-$arch/planex"
done

# --- SBOMs (in the background while the image builds) --------------------------
# One per architecture: build constraints choose the modules. No serial
# number and no timestamp, so two runs give the same bytes.
sbom_pids=()
for arch in "${arches[@]}"; do
  CGO_ENABLED=0 GOOS=linux GOARCH="$arch" GOFLAGS=-buildvcs=false \
    "$work/cyclonedx-gomod" app -json -licenses -noserial -notimestamp -main cmd/planex \
    -output "$OUT/planex-linux-$arch.cdx.json" . >"$work/sbom-$arch.log" 2>&1 &
  sbom_pids+=("$!")
done

# --- image ----------------------------------------------------------------------
# One image per architecture, collected in a manifest list; no container
# runs (scratch base, COPY only), so no emulation is needed. --timestamp
# sets the image's and the layer's times: the digest depends only on the
# binary and the Dockerfile.
for arch in "${arches[@]}"; do
  step "image linux/$arch"
  "$ENGINE" "${engine_flags[@]}" build --platform "linux/$arch" --manifest "$list" \
    --timestamp "$SOURCE_DATE_EPOCH" \
    --build-arg SOURCE=local --build-arg TARGETARCH="$arch" \
    --build-arg VERSION="$VERSION" --build-arg COMMIT="$COMMIT" \
    -f Dockerfile "$work/ctx" >&2
done
step "image archive"
"$ENGINE" "${engine_flags[@]}" manifest push --all --format oci "$list" "oci:$work/oci"
digest="$("$work/release" pack-image --layout "$work/oci" --out "$OUT/planex-image.oci.tar" --mtime "$SOURCE_DATE_EPOCH")"
[[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]] || die "pack-image printed $digest, not a digest"
reference="$REGISTRY@$digest"
echo "image index: $reference" >&2

step "SBOMs"
for i in "${!sbom_pids[@]}"; do
  arch="${arches[$i]}"
  wait "${sbom_pids[$i]}" || { cat "$work/sbom-$arch.log" >&2; die "cyclonedx-gomod for linux/$arch failed"; }
done

# --- chart ----------------------------------------------------------------------
step "chart"
cp -R deploy/helm/planex "$work/planex"
# The chart pins the release's image: image.repository and image.digest of
# values.yaml (the digest wins over the tag).
awk -v repo="$REGISTRY" -v digest="$digest" '
  /^[^ #]/ { inimage = ($0 ~ /^image:/) }
  inimage && /^  repository:/ { print "  repository: " repo; r++; next }
  inimage && /^  digest:/ { print "  digest: " digest; d++; next }
  { print }
  END { if (r != 1 || d != 1) exit 3 }
' deploy/helm/planex/values.yaml >"$work/planex/values.yaml" ||
  die "deploy/helm/planex/values.yaml: want one image.repository and one image.digest line under image:"
chart_version="${VERSION#v}"
(cd tools/helm && "$GO" tool helm package "$work/planex" --version "$chart_version" --app-version "$VERSION" --destination "$work/chart" >&2)
cp "$work/chart/planex-$chart_version.tgz" "$OUT/"
# helm stamps every entry with the packaging time.
"$work/release" normalize-tgz --mtime "$SOURCE_DATE_EPOCH" "$OUT/planex-$chart_version.tgz"

# --- manifests ------------------------------------------------------------------
step "manifests"
cp -R deploy/k8s "$OUT/manifests"
# The one place of the release: base/release.env, two lines, image= and
# version=; every overlay and component follows it.
env_file="$OUT/manifests/base/release.env"
if ! [ -f "$env_file" ] || [ "$(grep -c . "$env_file")" != 2 ] ||
  ! grep -q '^image=[^[:space:]]\+$' "$env_file" || ! grep -q '^version=[^[:space:]]\+$' "$env_file"; then
  die "deploy/k8s/base/release.env: want exactly two lines, image=<reference> and version=<version>"
fi
printf 'image=%s\nversion=%s\n' "$reference" "$VERSION" >"$env_file"

# --- record and checksums ---------------------------------------------------------
step "release.json and SHA256SUMS"
"$work/release" record --dir "$OUT" --version "$VERSION" --commit "$COMMIT" \
  --repository "$REGISTRY" --mtime "$SOURCE_DATE_EPOCH"
(cd "$OUT" && find . -type f ! -name SHA256SUMS -printf '%P\0' | LC_ALL=C sort -z | xargs -0 sha256sum >SHA256SUMS)

rm -rf "$final"
mkdir -p "$(dirname "$final")"
mv "$OUT" "$final"
OUT="$final"

step "done"
cat >&2 <<EOF
release $VERSION ($COMMIT) in $OUT:
$(cd "$OUT" && ls -1 | sed 's/^/  /')
image: $reference
check it: scripts/verify-release.sh $OUT
publish it: docs/releases.md
EOF
