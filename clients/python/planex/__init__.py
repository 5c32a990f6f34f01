"""planex: a Python client of the planex supervisor (planex.v1.SupervisorService).

    from planex import Client

    with Client("127.0.0.1:7400", token=..., ca="ca.pem") as c:
        run = c.start_run("How many open support tickets does Acme Corp have?")
        for event in c.watch_run(run.id):
            print(event.sequence, event.WhichOneof("payload"))

The generated messages are planex.v1.run_pb2, planex.v1.supervisor_pb2 and
their siblings (scripts/generate-python.sh); errors are in planex.errors.
"""

from planex.client import DEFAULT_ADDRESS, TERMINAL_STATUSES, Client
from planex.errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PlanexError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from planex.v1 import run_pb2, supervisor_pb2

__version__ = "0.1.0"

__all__ = [
    "Client",
    "DEFAULT_ADDRESS",
    "TERMINAL_STATUSES",
    "PlanexError",
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "run_pb2",
    "supervisor_pb2",
]
