#!/usr/bin/env bash
# scripts/generate-python.sh: regenerate the Python code of
# clients/python/planex/v1 from proto/ (buf.gen.python.yaml), with
# Debian's protoc and grpc_python_plugin:
#
#   apt-get install -y --no-install-recommends protobuf-compiler protobuf-compiler-grpc
#
# The generated modules import each other as planex.v1.*_pb2, which is the
# client package's own planex.v1 subpackage. CI runs this and fails on
# `git diff --exit-code clients/python/planex/v1`. $PLANEX_BUF, when set, is
# the buf to run (CI: the same version's official binary, .ci/install-buf).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in /usr/bin/protoc grpc_python_plugin; do
  command -v "$tool" >/dev/null || { echo "generate-python: $tool not found (apt-get install protobuf-compiler protobuf-compiler-grpc)" >&2; exit 1; }
done
out=clients/python/planex/v1
rm -rf "$out"
${PLANEX_BUF:-go tool buf} generate --template buf.gen.python.yaml
printf '"""Generated protobuf messages and gRPC stubs of planex.v1 (scripts/generate-python.sh); do not edit."""\n' >"$out/__init__.py"
