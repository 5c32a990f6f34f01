"""A thin, synchronous client of planex's SupervisorService.

The messages are the generated ones (planex.v1.*_pb2); this module adds
the connection (TLS, client certificates, API key), Python arguments for
the common fields, typed errors (planex.errors) and a watch that survives
dropped streams.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

import grpc
from google.protobuf import struct_pb2

from planex import errors
from planex.v1 import run_pb2, supervisor_pb2, supervisor_pb2_grpc

__all__ = ["Client", "TERMINAL_STATUSES", "DEFAULT_ADDRESS"]

#: The supervisor address of `planex dev`.
DEFAULT_ADDRESS = "127.0.0.1:7400"

#: Run statuses after which a run never changes again.
TERMINAL_STATUSES = frozenset(
    {
        run_pb2.RUN_STATUS_SUCCEEDED,
        run_pb2.RUN_STATUS_FAILED,
        run_pb2.RUN_STATUS_ESCALATED,
        run_pb2.RUN_STATUS_CANCELLED,
    }
)



def _resumable(err: grpc.RpcError) -> bool:
    """Whether watch_run reconnects after err: the server or the network
    went away (UNAVAILABLE), or the HTTP/2 stream was reset under the call
    (gRPC reports those as INTERNAL or UNKNOWN); the run's log is still
    there. A server's own INTERNAL error is not retried."""
    code = err.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return True
    details = (err.details() or "") if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) else ""
    return "RST_STREAM" in details or "Stream removed" in details

PathOrPEM = Union[str, "os.PathLike[str]", bytes]


def _pem(value: Optional[PathOrPEM], what: str) -> Optional[bytes]:
    """PEM bytes given as bytes, or read from a file path."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    try:
        with open(value, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{what}: {e}") from e


def _struct(value: Optional[Mapping[str, Any]], what: str) -> Optional[struct_pb2.Struct]:
    if value is None:
        return None
    if isinstance(value, struct_pb2.Struct):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"{what}: want a dict, got {type(value).__name__}")
    s = struct_pb2.Struct()
    s.update(dict(value))
    return s


def _enum(enum_type, prefix: str, value, what: str) -> int:
    """An enum value given as its number, its full name or its short name
    ("approve" for DECISION_KIND_APPROVE)."""
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        name = value.upper()
        if not name.startswith(prefix):
            name = prefix + name
        try:
            return enum_type.Value(name)
        except ValueError:
            pass
    names = ", ".join(n[len(prefix):].lower() for n in enum_type.keys() if not n.endswith("UNSPECIFIED"))
    raise ValueError(f"{what} {value!r}: want one of {names}")


class Client:
    """A connection to a planex supervisor.

    Client(address, token=None, ca=None, cert=None, key=None,
    server_name=None, plaintext=False, timeout=30.0)

    address: host:port of the supervisor's gRPC API (planex dev: 127.0.0.1:7400).
    token: API key sent as "authorization: Bearer <token>"; defaults to
        $PLANEX_TOKEN.
    ca: CA bundle (file path or PEM bytes) verifying the server; None uses
        the system roots.
    cert, key: a client certificate and its key (mTLS), path or PEM bytes.
    server_name: the name to verify the server certificate against, when it
        is not the address's host.
    plaintext: no TLS (a supervisor started with --plaintext).
    timeout: default deadline of unary calls, in seconds (None: no deadline).

    Use it as a context manager, or call close(), to release the channel.
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        token: Optional[str] = None,
        ca: Optional[PathOrPEM] = None,
        cert: Optional[PathOrPEM] = None,
        key: Optional[PathOrPEM] = None,
        server_name: Optional[str] = None,
        plaintext: bool = False,
        timeout: Optional[float] = 30.0,
    ):
        if not address:
            raise ValueError("address: required (host:port of the supervisor)")
        if (cert is None) != (key is None):
            raise ValueError("cert, key: give both or neither")
        if plaintext and (ca is not None or cert is not None):
            raise ValueError("plaintext: conflicts with ca/cert/key")
        if token is None:
            token = os.environ.get("PLANEX_TOKEN") or None
        self._metadata: Sequence[tuple] = (("authorization", "Bearer " + token.strip()),) if token else ()
        self._timeout = timeout
        options = []
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if plaintext:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_pem(ca, "ca"),
                private_key=_pem(key, "key"),
                certificate_chain=_pem(cert, "cert"),
            )
            self._channel = grpc.secure_channel(address, creds, options=options)
        self._stub = supervisor_pb2_grpc.SupervisorServiceStub(self._channel)

    # --- lifecycle -----------------------------------------------------

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def stub(self) -> supervisor_pb2_grpc.SupervisorServiceStub:
        """The generated stub, for calls this wrapper does not cover (RunBatch)."""
        return self._stub

    def _call(self, method, request, timeout):
        try:
            return method(request, metadata=self._metadata, timeout=self._timeout if timeout is None else timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    # --- runs ----------------------------------------------------------

    def start_run(
        self,
        goal: str,
        *,
        inputs: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        idempotency_key: str = "",
        budget: Optional[run_pb2.Budget] = None,
        approve_plans: bool = False,
        planner_backend: str = "",
        timeout: Optional[float] = None,
    ) -> run_pb2.Run:
        """Starts a run for goal and returns it (status PENDING or later).

        With idempotency_key, starting the same run again returns the first
        one instead of a new run.
        """
        req = supervisor_pb2.StartRunRequest(
            goal=goal,
            inputs=_struct(inputs, "inputs"),
            labels=dict(labels or {}),
            idempotency_key=idempotency_key,
            budget=budget,
            approve_plans=approve_plans,
            planner_backend=planner_backend,
        )
        return self._call(self._stub.StartRun, req, timeout).run

    def get_run(self, run_id: str, *, timeout: Optional[float] = None) -> run_pb2.Run:
        """Returns the run's current state; NotFound when there is none."""
        return self._call(self._stub.GetRun, supervisor_pb2.GetRunRequest(run_id=run_id), timeout).run

    def list_runs(
        self,
        *,
        statuses: Iterable[Union[int, str]] = (),
        labels: Optional[Mapping[str, str]] = None,
        filter: Optional[supervisor_pb2.RunFilter] = None,
        page_size: int = 0,
        page_token: str = "",
        view: Union[int, str] = 0,
        timeout: Optional[float] = None,
    ) -> supervisor_pb2.ListRunsResponse:
        """Returns one page of runs (newest first) and the next page's token
        ("" on the last page). statuses take RunStatus values or names
        ("waiting"); view is "full" (the default: every field) or "basic"
        (what a list shows, from the supervisor's run index, no run read)."""
        req = supervisor_pb2.ListRunsRequest(
            statuses=[_enum(run_pb2.RunStatus, "RUN_STATUS_", s, "statuses") for s in statuses],
            labels=dict(labels or {}),
            filter=filter,
            page_size=page_size,
            page_token=page_token,
            view=_enum(supervisor_pb2.RunView, "RUN_VIEW_", view, "view"),
        )
        return self._call(self._stub.ListRuns, req, timeout)

    def iter_runs(self, **kwargs) -> Iterator[run_pb2.Run]:
        """Yields every run list_runs(**kwargs) selects, page after page."""
        token = kwargs.pop("page_token", "")
        while True:
            page = self.list_runs(page_token=token, **kwargs)
            yield from page.runs
            token = page.next_page_token
            if not token:
                return

    def watch_run(
        self,
        run_id: str,
        from_sequence: int = 0,
        *,
        resume: bool = True,
        max_retries: int = 8,
        backoff: float = 0.2,
    ) -> Iterator[run_pb2.RunEvent]:
        """Yields the run's events from from_sequence (0: the first), those
        already in its log and then new ones, until the run finished.

        When the stream breaks (the supervisor restarted, the network went
        away) it reconnects from the last event's sequence + 1, with
        exponential backoff from backoff seconds, up to max_retries times in
        a row without a new event; no event is yielded twice. Close the
        generator (or leave the loop) to stop watching.
        """
        last = max(from_sequence - 1, 0)
        failures = 0
        while True:
            req = supervisor_pb2.WatchRunRequest(run_id=run_id, from_sequence=last + 1 if last else from_sequence)
            stream = self._stub.WatchRun(req, metadata=self._metadata)
            try:
                for resp in stream:
                    ev = resp.event
                    if ev.sequence and ev.sequence <= last:
                        continue  # sent again after a reconnect
                    last = ev.sequence or last
                    failures = 0
                    yield ev
                    if ev.WhichOneof("payload") == "finished":
                        return
                return  # the server ends the stream after the run's last event
            except grpc.RpcError as e:
                if not resume or not _resumable(e) or failures >= max_retries:
                    raise errors.from_rpc_error(e) from None
                failures += 1
                time.sleep(min(backoff * (2 ** (failures - 1)), 5.0))
            finally:
                stream.cancel()

    def wait_run(
        self,
        run_id: str,
        *,
        until=lambda run: run.status in TERMINAL_STATUSES,
        poll: float = 0.2,
        timeout: Optional[float] = None,
    ) -> run_pb2.Run:
        """Polls the run until until(run) holds (by default: it finished) and
        returns it; DeadlineExceeded after timeout seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.get_run(run_id)
            if until(run):
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise errors.DeadlineExceeded(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"run {run_id} still {run_pb2.RunStatus.Name(run.status)} after {timeout}s",
                )
            time.sleep(poll)

    def cancel_run(self, run_id: str, reason: str = "", *, timeout: Optional[float] = None) -> run_pb2.Run:
        """Cancels the run and returns it once cancelled (a finished run is
        returned as it is)."""
        return self._call(self._stub.CancelRun, supervisor_pb2.CancelRunRequest(run_id=run_id, reason=reason), timeout).run

    # --- gates -----------------------------------------------------------

    def list_gates(self, run_id: str = "", *, timeout: Optional[float] = None) -> Sequence[supervisor_pb2.OpenGate]:
        """Returns the open gates of run_id, or of every run when empty."""
        return list(self._call(self._stub.ListGates, supervisor_pb2.ListGatesRequest(run_id=run_id), timeout).gates)

    def decide(
        self,
        run_id: str,
        gate_id: str,
        decision: Union[int, str] = "approve",
        *,
        comment: str = "",
        edited_args: Optional[Mapping[str, Any]] = None,
        actor: str = "",
        stop_run: bool = False,
        timeout: Optional[float] = None,
    ) -> run_pb2.Run:
        """Decides an open gate: "approve", "reject" or "edit" (with
        edited_args) and returns the run."""
        req = supervisor_pb2.DecideRequest(
            run_id=run_id,
            gate_id=gate_id,
            decision=_enum(run_pb2.DecisionKind, "DECISION_KIND_", decision, "decision"),
            comment=comment,
            edited_args=_struct(edited_args, "edited_args"),
            actor=actor,
            stop_run=stop_run,
        )
        return self._call(self._stub.Decide, req, timeout).run

    # --- tools -------------------------------------------------------------

    def list_tools(self, pool: str = "", *, timeout: Optional[float] = None) -> Sequence[supervisor_pb2.RegisteredTool]:
        """Returns the registered tools (of pool, when given) with their live replicas."""
        return list(self._call(self._stub.ListTools, supervisor_pb2.ListToolsRequest(pool=pool), timeout).tools)

    # --- run surgery -------------------------------------------------------

    def reset_run(
        self,
        run_id: str,
        *,
        to_sequence: int = 0,
        from_step: str = "",
        reason: str = "",
        replan: bool = False,
        step_args: Optional[Mapping[str, Mapping[str, Any]]] = None,
        unknown_outcomes: Sequence[Any] = (),
        budget: Optional[run_pb2.Budget] = None,
        actor: str = "",
        request_id: str = "",
        dry_run: bool = False,
        timeout: Optional[float] = None,
    ) -> supervisor_pb2.ResetRunResponse:
        """Resets a run to an earlier point (to_sequence or from_step) and
        runs it again from there; dry_run only reports what would rerun."""
        req = supervisor_pb2.ResetRunRequest(
            run_id=run_id,
            to_sequence=to_sequence,
            from_step=from_step,
            reason=reason,
            replan=replan,
            step_args={k: _struct(v, f"step_args[{k}]") for k, v in (step_args or {}).items()},
            unknown_outcomes=list(unknown_outcomes),
            budget=budget,
            actor=actor,
            request_id=request_id,
            dry_run=dry_run,
        )
        return self._call(self._stub.ResetRun, req, timeout)

    def fork_run(
        self,
        run_id: str,
        *,
        at_sequence: int = 0,
        from_step: str = "",
        goal: str = "",
        inputs: Optional[Mapping[str, Any]] = None,
        step_args: Optional[Mapping[str, Mapping[str, Any]]] = None,
        labels: Optional[Mapping[str, str]] = None,
        reason: str = "",
        replan: bool = False,
        budget: Optional[run_pb2.Budget] = None,
        request_id: str = "",
        dry_run: bool = False,
        timeout: Optional[float] = None,
    ) -> supervisor_pb2.ForkRunResponse:
        """Starts a new run sharing the run's history up to a point
        (at_sequence or from_step); dry_run only reports what would rerun."""
        req = supervisor_pb2.ForkRunRequest(
            run_id=run_id,
            at_sequence=at_sequence,
            from_step=from_step,
            goal=goal,
            inputs=_struct(inputs, "inputs"),
            step_args={k: _struct(v, f"step_args[{k}]") for k, v in (step_args or {}).items()},
            labels=dict(labels or {}),
            reason=reason,
            replan=replan,
            budget=budget,
            request_id=request_id,
            dry_run=dry_run,
        )
        return self._call(self._stub.ForkRun, req, timeout)
