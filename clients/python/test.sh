#!/usr/bin/env bash
# clients/python/test.sh: the Python client's tests (unittest) against a
# real `planex dev`, with Debian's Python packages:
#
#   apt-get install -y --no-install-recommends python3-grpcio python3-protobuf
#
# The planex binary is $PLANEX_BINARY, else built from this repository.
# Extra arguments go to unittest (e.g. -k decide).
set -euo pipefail
cd "$(dirname "$0")"
py=/usr/bin/python3
"$py" -c 'import grpc, google.protobuf' 2>/dev/null || {
  echo "clients/python: $py lacks grpc/protobuf (apt-get install python3-grpcio python3-protobuf)" >&2
  exit 1
}
exec "$py" -m unittest discover -s tests -t tests -v "$@"
