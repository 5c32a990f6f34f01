"""Generated protobuf messages and gRPC stubs of planex.v1 (scripts/generate-python.sh); do not edit."""
