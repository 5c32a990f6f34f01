# syntax=docker/dockerfile:1
#
# The planex image: one static binary on an empty base.
#
# Image contract (what deploy/k8s and deploy/helm rely on):
#   - entrypoint /planex; the subcommand (supervisor, planner, executor ...)
#     comes as the container's args
#   - runs as uid/gid 65532 (non-root) and writes nothing outside mounted
#     volumes, so the root filesystem may be read-only
#   - no shell, no package manager, no OS files: CA roots are embedded in the
#     binary (golang.org/x/crypto/x509roots/fallback)
#   - gRPC health on the service port; `planex health --addr 127.0.0.1:PORT`
#     checks it from inside the container
#
# Releases (`make release`, scripts/release.sh, docs/releases.md) and
# `make image` package a binary built on the host with the release flags
# (SOURCE=local: no base image at all, nothing runs at build time, so
# podman builds every architecture without emulation):
#   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -buildvcs=false \
#     -ldflags '-s -w -buildid= -X main.version=... -X main.commit=...' -o bin/linux-amd64/planex ./cmd/planex
#   podman build --build-arg SOURCE=local --build-arg TARGETARCH=amd64 ...
# Build from source instead (needs a Go toolchain image, pinned by digest,
# and the module proxy):
#   docker build --build-arg SOURCE=build --build-arg GO_IMAGE=docker.io/library/golang@sha256:<digest> \
#     --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) -t planex .
# A GO_IMAGE without a digest stops the build (the tag below only names
# the toolchain to pin: a tag can move under a release).

# SOURCE selects where the binary comes from: "build" compiles it in a Go
# container, "local" copies bin/linux-$TARGETARCH/planex from the context.
ARG SOURCE=build
ARG GO_IMAGE=docker.io/library/golang:1.26.8-bookworm

FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=dev
ARG COMMIT=unknown
ARG GO_IMAGE
RUN case "${GO_IMAGE}" in *@sha256:*) ;; *) \
      echo "GO_IMAGE=${GO_IMAGE} is not pinned by digest: pass --build-arg GO_IMAGE=docker.io/library/golang@sha256:<digest of golang:1.26.8-bookworm> (make image IMAGE_SOURCE=build GO_IMAGE=...)" >&2; \
      exit 1;; \
    esac
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download -x >/dev/null
COPY cmd ./cmd
COPY gen ./gen
COPY internal ./internal
COPY services ./services
# The same flags as `make binary-linux` and `make release`: static,
# reproducible paths, no symbol table or build ID, version and commit
# stamped.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -ldflags "-s -w -buildid= -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /planex ./cmd/planex

FROM scratch AS local
ARG TARGETARCH=amd64
COPY bin/linux-${TARGETARCH}/planex /planex

FROM ${SOURCE} AS binary

FROM scratch
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="planex" \
      org.opencontainers.image.description="planex: AI agents with the planner-executor pattern on NATS JetStream" \
      org.opencontainers.image.source="https://github.com/planex-dev/planex" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
COPY --from=binary /planex /planex
USER 65532:65532
# Service ports: supervisor 7400, planner 7401, executors 7402, metrics 9090.
EXPOSE 7400 7401 7402 9090
ENTRYPOINT ["/planex"]
CMD ["--help"]
