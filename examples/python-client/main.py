#!/usr/bin/env python3
"""Start a planex run, follow its events, and approve its gates.

    # with `planex dev` running (it prints the CA and token paths):
    set -a; eval "$(planex dev credentials)"; set +a   # exports PLANEX_DEV_ADDR, PLANEX_DEV_CA_FILE, PLANEX_DEV_TOKEN_FILE
    /usr/bin/python3 examples/python-client/main.py "Close support ticket 410"

Needs Debian's python3-grpcio and python3-protobuf (no PyPI).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

from planex import Client, PlanexError, run_pb2  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("goal", nargs="?", default="How many open support tickets does Acme Corp have?")
    p.add_argument("--addr", default=os.environ.get("PLANEX_DEV_ADDR", "127.0.0.1:7400"))
    p.add_argument("--ca", default=os.environ.get("PLANEX_DEV_CA_FILE"), help="CA bundle of the supervisor (planex dev: <data-dir>/credentials/ca.pem)")
    p.add_argument("--token-file", default=os.environ.get("PLANEX_DEV_TOKEN_FILE"), help="file holding the API key (planex dev: <data-dir>/credentials/cli.token)")
    p.add_argument("--approve", action=argparse.BooleanOptionalAction, default=True, help="approve the run's gates as they open")
    args = p.parse_args()

    token = None
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    try:
        with Client(args.addr, token=token, ca=args.ca) as c:
            run = c.start_run(args.goal)
            print(f"run {run.id}: {args.goal}")
            for ev in c.watch_run(run.id):
                kind = ev.WhichOneof("payload")
                print(f"  #{ev.sequence} {kind}")
                if kind == "gate_opened" and args.approve:
                    gate = ev.gate_opened.gate
                    c.decide(run.id, gate.id, "approve", comment="approved by examples/python-client")
                    print(f"  approved gate {gate.id} ({gate.reason})")
            done = c.get_run(run.id)
            print(f"run {run.id} {run_pb2.RunStatus.Name(done.status)}")
            return 0 if done.status == run_pb2.RUN_STATUS_SUCCEEDED else 1
    except PlanexError as e:
        print(f"planex: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
