"""Typed errors of the planex client.

Every failed call raises a PlanexError subclass chosen by the gRPC status
code, carrying the code, the server's message (safe to show: the supervisor
never puts internals in it) and, for INVALID_ARGUMENT, the offending field
the message starts with ("pool", "run_id", "inputs.customer").
"""

from __future__ import annotations

import re
from typing import Optional

import grpc

__all__ = [
    "PlanexError",
    "Cancelled",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
    "from_rpc_error",
]


class PlanexError(Exception):
    """A call to the planex supervisor failed.

    Attributes:
        code: the grpc.StatusCode of the failure.
        message: the server's message, safe to show to a user.
        field: the request field the server blamed (INVALID_ARGUMENT), or None.
    """

    def __init__(self, code: grpc.StatusCode, message: str, field: Optional[str] = None):
        super().__init__(f"{code.name}: {message}" if code is not None else message)
        self.code = code
        self.message = message
        self.field = field


class Cancelled(PlanexError):
    """The call was cancelled (CANCELLED)."""


class InvalidArgument(PlanexError):
    """The request is malformed; field names what to fix (INVALID_ARGUMENT)."""


class DeadlineExceeded(PlanexError):
    """The call's deadline passed (DEADLINE_EXCEEDED)."""


class NotFound(PlanexError):
    """The run, gate or tool does not exist (NOT_FOUND)."""


class AlreadyExists(PlanexError):
    """The thing to create exists already (ALREADY_EXISTS)."""


class PermissionDenied(PlanexError):
    """The caller's role may not do this (PERMISSION_DENIED)."""


class ResourceExhausted(PlanexError):
    """A quota or rate limit was hit (RESOURCE_EXHAUSTED)."""


class FailedPrecondition(PlanexError):
    """The request does not fit the run's state, e.g. deciding a decided gate (FAILED_PRECONDITION)."""


class Aborted(PlanexError):
    """The operation was aborted by a conflict; retry it (ABORTED)."""


class Unimplemented(PlanexError):
    """The server does not offer this method (UNIMPLEMENTED)."""


class Internal(PlanexError):
    """The server failed; its logs say why (INTERNAL, UNKNOWN)."""


class Unavailable(PlanexError):
    """The server or its run store cannot be reached; retry later (UNAVAILABLE)."""


class DataLoss(PlanexError):
    """A run's log is corrupt (DATA_LOSS); the message says how to inspect it."""


class Unauthenticated(PlanexError):
    """No valid API key or client certificate (UNAUTHENTICATED)."""


_BY_CODE = {
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNKNOWN: Internal,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}

# The supervisor's INVALID_ARGUMENT messages start with the field they
# blame: `pool "x": want a pool name`, `run_id: required`,
# `inputs.customer: …`, `step_args[s1].to: …`.
_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:(?:\.[A-Za-z_][A-Za-z0-9_]*)|\[[^\]\s]*\])*)(?=[: ])")


def _field_of(message: str) -> Optional[str]:
    m = _FIELD.match(message or "")
    return m.group(1) if m else None


def from_rpc_error(err: grpc.RpcError) -> PlanexError:
    """Converts a grpc.RpcError raised by a call into its PlanexError."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    message = message or ""
    cls = _BY_CODE.get(code, PlanexError)
    field = _field_of(message) if code == grpc.StatusCode.INVALID_ARGUMENT else None
    return cls(code, message, field)
