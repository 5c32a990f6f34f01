# planex developer targets. Everything runs with only Go installed: buf and
# the protoc plugins are pinned as Go tools in go.mod, Jaeger in tools/jaeger.

GO ?= go

# Release stamps: `planex version` prints them, the image carries them as
# OCI labels.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
ARCH ?= $(shell $(GO) env GOARCH)
# The flags of every release binary (scripts/release.sh and the Dockerfile
# use the same): static (no cgo), no local paths, no symbol table, no build
# ID or VCS stamp that differs between machines, stamped with version and
# commit.
BUILD_FLAGS = -trimpath -buildvcs=false -ldflags '-s -w -buildid= -X main.version=$(VERSION) -X main.commit=$(COMMIT)'

# Container engine: podman when installed, else docker. In a rootless or
# nested sandbox podman may need e.g. ENGINE_FLAGS='--storage-driver vfs --isolation chroot'.
ENGINE ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null)
ENGINE_FLAGS ?=
# Where releases are pushed (docs/releases.md).
REGISTRY ?= ghcr.io/planex-dev/planex
IMAGE ?= $(REGISTRY):$(VERSION)
# local: package bin/linux-$(ARCH)/planex built here; build: compile inside
# a golang image (needs that image and the module proxy).
IMAGE_SOURCE ?= local
# The Go image of IMAGE_SOURCE=build, by digest: there is no default, as no
# digest is vouched for here; pass the digest of the multi-arch index of
# golang:1.26.8-bookworm you pulled and checked, e.g.
#   make image IMAGE_SOURCE=build GO_IMAGE=docker.io/library/golang@sha256:<digest>
GO_IMAGE ?=
# Architectures of `make release`.
ARCHES ?= amd64 arm64

.PHONY: all build binary-linux image release verify-release generate lint test test-short bench ci

all: build

## build: compile the planex binary into bin/planex
build:
	$(GO) build -o bin/planex ./cmd/planex

## binary-linux: the release binary for Linux, as the image holds it
binary-linux:
	CGO_ENABLED=0 GOOS=linux GOARCH=$(ARCH) $(GO) build $(BUILD_FLAGS) -o bin/linux-$(ARCH)/planex ./cmd/planex

## image: build the container image $(IMAGE) with podman or docker
image: $(if $(filter local,$(IMAGE_SOURCE)),binary-linux)
	@test -n "$(ENGINE)" || { echo "make image: neither podman nor docker is installed" >&2; exit 1; }
	@case "$(IMAGE_SOURCE)" in local|build) ;; *) echo "make image: IMAGE_SOURCE=$(IMAGE_SOURCE): want local or build" >&2; exit 1;; esac
	@if [ "$(IMAGE_SOURCE)" = build ]; then case "$(GO_IMAGE)" in *@sha256:*) ;; *) \
		echo "make image IMAGE_SOURCE=build: GO_IMAGE='$(GO_IMAGE)' is not pinned by digest; pass GO_IMAGE=docker.io/library/golang@sha256:<digest of golang:1.26.8-bookworm>" >&2; exit 1;; esac; fi
	$(ENGINE) $(ENGINE_FLAGS) build --build-arg SOURCE=$(IMAGE_SOURCE) --build-arg TARGETARCH=$(ARCH) \
		$(if $(filter build,$(IMAGE_SOURCE)),--build-arg GO_IMAGE=$(GO_IMAGE)) \
		--build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE) .

## release: reproducible release artefacts in dist/$(VERSION)/: static
## binaries for $(ARCHES), the multi-arch OCI image archive, SBOMs, the
## chart and the manifests pinned by digest, SHA256SUMS (docs/releases.md).
## make release VERSION=v0.2.0 [ARCHES="amd64 arm64"] [REGISTRY=...]
release:
	VERSION='$(VERSION)' ARCHES='$(ARCHES)' REGISTRY='$(REGISTRY)' ENGINE='$(or $(ENGINE),podman)' \
		ENGINE_FLAGS='$(ENGINE_FLAGS)' GO='$(GO)' bash scripts/release.sh

## verify-release: check dist/$(VERSION)/ as CI does (scripts/verify-release.sh)
verify-release:
	GO='$(GO)' bash scripts/verify-release.sh dist/$(VERSION)

## generate: regenerate gen/ from proto/ with the pinned buf and plugins
generate:
	$(GO) tool buf generate

## lint: buf lint + go vet
lint:
	$(GO) tool buf lint
	$(GO) vet ./...

## test: the full test suite (what CI runs)
test:
	$(GO) test -race -count=1 -timeout 30m ./...

## test-short: skip the slow end-to-end tests (Jaeger build, multi-process)
test-short:
	$(GO) test -short -race ./...

## bench: engine, executor and tracing benchmarks
bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./services/... ./internal/...

## ci: everything CI checks
ci:
	bash .ci/run
