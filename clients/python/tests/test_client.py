"""Tests of the planex Python client against a real `planex dev`.

Run with clients/python/test.sh (or: cd clients/python &&
/usr/bin/python3 -m unittest discover -s tests -v).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import grpc  # noqa: E402

import planex  # noqa: E402
from planex import Client, errors  # noqa: E402
from planex.v1 import run_pb2  # noqa: E402

from devstack import REPO, DevStack  # noqa: E402

ANSWER_GOAL = "How many open support tickets does Acme Corp have?"
GATED_GOAL = "Close support ticket 410"
WAIT = 120.0  # seconds any condition may take on a loaded machine

stack: DevStack


def setUpModule():
    global stack
    stack = DevStack()
    try:
        stack.start()
    except BaseException:
        stack.stop()
        raise


def tearDownModule():
    stack.stop()


def client(**kw) -> Client:
    kw.setdefault("token", stack.token)
    kw.setdefault("ca", stack.ca)
    return Client(stack.address, **kw)


class ErrorsTest(unittest.TestCase):
    """The mapping of gRPC statuses to typed errors."""

    def test_field_of_invalid_argument(self):
        for message, field in [
            ('pool "Bad Pool": want a pool name like "sql"', "pool"),
            ("run_id: required", "run_id"),
            ("inputs.customer: want a string", "inputs.customer"),
            ("step_args[s1].to: not an address", "step_args[s1].to"),
            ("", None),
        ]:
            with self.subTest(message=message):
                self.assertEqual(errors._field_of(message), field)

    def test_client_arguments(self):
        with self.assertRaisesRegex(ValueError, "cert, key"):
            Client("127.0.0.1:1", cert=b"x")
        with self.assertRaisesRegex(ValueError, "plaintext"):
            Client("127.0.0.1:1", plaintext=True, ca=b"x")
        with self.assertRaisesRegex(ValueError, "ca: "):
            Client("127.0.0.1:1", ca="/nonexistent/ca.pem")
        with Client("127.0.0.1:1", plaintext=True) as c:
            with self.assertRaisesRegex(ValueError, "decision 'maybe': want one of approve, reject, edit"):
                c.decide("r1", "g1", "maybe")


class ClientTest(unittest.TestCase):
    """Calls against planex dev."""

    def setUp(self):
        self.c = client()
        self.addCleanup(self.c.close)

    def wait_status(self, run_id, *statuses):
        return self.c.wait_run(run_id, until=lambda r: r.status in statuses or r.status in planex.TERMINAL_STATUSES, timeout=WAIT)

    def test_start_and_watch_to_the_end(self):
        run = self.c.start_run(ANSWER_GOAL, labels={"test": "python"})
        self.assertTrue(run.id)
        events = list(self.c.watch_run(run.id))
        self.assertEqual([e.sequence for e in events], list(range(1, len(events) + 1)), "sequences without gaps from 1")
        self.assertEqual(events[0].WhichOneof("payload"), "created")
        self.assertEqual(events[-1].WhichOneof("payload"), "finished")
        got = self.c.get_run(run.id)
        self.assertEqual(got.status, run_pb2.RUN_STATUS_SUCCEEDED, run_pb2.RunStatus.Name(got.status))

        # Listed, by label too.
        ids = [r.id for r in self.c.iter_runs(labels={"test": "python"}, page_size=1)]
        self.assertIn(run.id, ids)
        page = self.c.list_runs(statuses=["succeeded"])
        self.assertIn(run.id, [r.id for r in page.runs])
        # The basic view: from the run index (which follows the snapshots,
        # so it may show the finish moments later), step counts, no steps.
        deadline = time.monotonic() + 10
        while True:
            basic = {r.id: r for r in self.c.iter_runs(labels={"test": "python"}, view="basic")}
            b = basic.get(run.id)
            if b is not None and b.status == run_pb2.RUN_STATUS_SUCCEEDED or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertIsNotNone(b)
        self.assertEqual(b.status, run_pb2.RUN_STATUS_SUCCEEDED)
        self.assertEqual(b.step_counts.total, len(got.steps))
        self.assertEqual(b.goal, got.goal)
        self.assertEqual(len(b.steps), 0)
        with self.assertRaisesRegex(ValueError, "view 'summary': want one of"):
            self.c.list_runs(view="summary")

        # Watching from a later sequence starts there.
        tail = list(self.c.watch_run(run.id, from_sequence=3))
        self.assertEqual([e.sequence for e in tail], [e.sequence for e in events[2:]])

    def test_watch_resumes_after_a_dropped_stream(self):
        run = self.c.start_run(ANSWER_GOAL)
        self.c.wait_run(run.id, timeout=WAIT)
        whole = [e.SerializeToString(deterministic=True) for e in self.c.watch_run(run.id)]
        self.assertGreater(len(whole), 3)

        # The first stream breaks after two events, as when the
        # supervisor restarts; the watch reconnects from sequence 3.
        real = self.c._stub.WatchRun
        requests = []

        class Dropped(grpc.RpcError):
            def code(self):
                return grpc.StatusCode.UNAVAILABLE

            def details(self):
                return "connection reset"

        class Flaky:
            def __init__(self, stream, drop_after):
                self.stream, self.drop_after = stream, drop_after

            def __iter__(self):
                for i, resp in enumerate(self.stream):
                    if self.drop_after is not None and i == self.drop_after:
                        raise Dropped()
                    yield resp

            def cancel(self):
                self.stream.cancel()

        def watch(req, **kw):
            requests.append(req.from_sequence)
            return Flaky(real(req, **kw), 2 if len(requests) == 1 else None)

        self.c._stub.WatchRun = watch
        try:
            resumed = [e.SerializeToString(deterministic=True) for e in self.c.watch_run(run.id, backoff=0.01)]
        finally:
            self.c._stub.WatchRun = real
        self.assertEqual(requests, [0, 3])
        self.assertEqual(resumed, whole)

    def test_decide_a_gate(self):
        run = self.c.start_run(GATED_GOAL)
        waiting = self.wait_status(run.id, run_pb2.RUN_STATUS_WAITING)
        self.assertEqual(waiting.status, run_pb2.RUN_STATUS_WAITING, stack.logs())
        gates = self.c.list_gates(run.id)
        self.assertEqual(len(gates), 1, gates)
        gate = gates[0]
        self.assertEqual(gate.run_id, run.id)
        self.assertIn(gate, self.c.list_gates())

        # A decision on a gate that does not exist is refused.
        with self.assertRaises(errors.PlanexError) as cm:
            self.c.decide(run.id, "no-such-gate", "approve")
        self.assertIn(cm.exception.code, (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT))

        self.c.decide(run.id, gate.gate.id, "approve", comment="python client test")
        done = self.c.wait_run(run.id, timeout=WAIT)
        decided = [g for g in done.gates if g.id == gate.gate.id]
        self.assertEqual(len(decided), 1)
        self.assertEqual(decided[0].decision, run_pb2.DECISION_KIND_APPROVE)
        self.assertEqual(decided[0].comment, "python client test")
        self.assertEqual(done.status, run_pb2.RUN_STATUS_SUCCEEDED, run_pb2.RunStatus.Name(done.status))

        # The watch shows the gate opened and decided.
        kinds = [e.WhichOneof("payload") for e in self.c.watch_run(run.id)]
        self.assertIn("gate_opened", kinds)
        self.assertIn("gate_decided", kinds)

    def test_cancel_a_waiting_run(self):
        run = self.c.start_run(GATED_GOAL)
        self.wait_status(run.id, run_pb2.RUN_STATUS_WAITING)
        cancelled = self.c.cancel_run(run.id, reason="python client test")
        self.assertEqual(cancelled.status, run_pb2.RUN_STATUS_CANCELLED, run_pb2.RunStatus.Name(cancelled.status))

    def test_reset_and_fork_dry_runs(self):
        run = self.c.start_run(ANSWER_GOAL)
        done = self.c.wait_run(run.id, timeout=WAIT)
        first = done.steps[0].step_id
        reset = self.c.reset_run(run.id, from_step=first, reason="python client test", dry_run=True)
        self.assertTrue(reset.dry_run)
        self.assertIn(first, reset.rerun)
        fork = self.c.fork_run(run.id, from_step=first, reason="python client test", dry_run=True)
        self.assertTrue(fork.dry_run)
        self.assertIn(first, fork.rerun)

    def test_list_tools(self):
        tools = self.c.list_tools()
        self.assertTrue(tools)
        for t in tools:
            self.assertTrue(t.spec.name.startswith(t.spec.pool + "."), t.spec.name)
            self.assertTrue(t.replicas, t.spec.name)
        pool = tools[0].spec.pool
        self.assertTrue(all(t.spec.pool == pool for t in self.c.list_tools(pool)))

    def test_not_found(self):
        with self.assertRaises(errors.NotFound) as cm:
            self.c.get_run("r0123456789abcdef")
        self.assertEqual(cm.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertTrue(cm.exception.message)
        with self.assertRaises(errors.NotFound):
            list(self.c.watch_run("r0123456789abcdef"))

    def test_invalid_argument_names_the_field(self):
        with self.assertRaises(errors.InvalidArgument) as cm:
            self.c.list_tools("Not A Pool!")
        self.assertEqual(cm.exception.field, "pool")

    def test_unauthenticated(self):
        with client(token="not-a-valid-key") as bad:
            with self.assertRaises(errors.Unauthenticated) as cm:
                bad.list_runs()
            self.assertEqual(cm.exception.code, grpc.StatusCode.UNAUTHENTICATED)
            with self.assertRaises(errors.Unauthenticated):
                list(bad.watch_run("r0123456789abcdef"))

    def test_context_manager_closes_the_channel(self):
        with client() as c:
            c.list_tools()
        with self.assertRaises(ValueError):  # grpc: "Cannot invoke RPC on closed channel!"
            c.list_tools()


class ExampleTest(unittest.TestCase):
    """examples/python-client runs against planex dev."""

    def test_example_runs_and_approves(self):
        env = dict(os.environ, PLANEX_DEV_ADDR=stack.address, PLANEX_DEV_CA_FILE=stack.ca,
                   PLANEX_DEV_TOKEN_FILE=os.path.join(stack.data_dir, "credentials", "cli.token"))
        out = subprocess.run([sys.executable, os.path.join(REPO, "examples", "python-client", "main.py"), "Close support ticket 400"],
                             env=env, capture_output=True, text=True, timeout=WAIT)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("approved gate", out.stdout)
        self.assertIn("RUN_STATUS_SUCCEEDED", out.stdout)


if __name__ == "__main__":
    unittest.main()
