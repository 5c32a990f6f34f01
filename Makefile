# planex developer targets. Everything runs with only Go installed: buf and
# the protoc plugins are pinned as Go tools in go.mod, Jaeger in tools/jaeger.

GO ?= go

.PHONY: all build generate lint test test-short bench ci

all: build

## build: compile the planex binary into bin/planex
build:
	$(GO) build -o bin/planex ./cmd/planex

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
