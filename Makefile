# planex developer targets. Everything runs with only Go installed: buf and
# the protoc plugins are pinned as Go tools in go.mod, Jaeger in tools/jaeger.

GO ?= go

# Release stamps: `planex version` prints them, the image carries them as
# OCI labels.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
ARCH ?= $(shell $(GO) env GOARCH)
# The flags of every release binary (the Dockerfile and CI use the same):
# static (no cgo), no local paths, no symbol table, stamped.
BUILD_FLAGS = -trimpath -ldflags '-s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)'

# Container engine: podman when installed, else docker. In a rootless or
# nested sandbox podman may need e.g. ENGINE_FLAGS='--storage-driver vfs --isolation chroot'.
ENGINE ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null)
ENGINE_FLAGS ?=
IMAGE ?= ghcr.io/planex-dev/planex:$(VERSION)
# local: package bin/linux-$(ARCH)/planex built here; build: compile inside
# a golang image (needs that image and the module proxy).
IMAGE_SOURCE ?= local

.PHONY: all build binary-linux image generate lint test test-short bench ci

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
	$(ENGINE) $(ENGINE_FLAGS) build --build-arg SOURCE=$(IMAGE_SOURCE) --build-arg TARGETARCH=$(ARCH) \
		--build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE) .

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
