"""An agreement point: every rank says whether its own part worked, and all learn it at once.

Work each rank does on its own (building the model and data from user factories) can fail on
one rank only. Without a meeting, the others walk into the next collective (DDP's broadcast of
the weights) and wait there until the failing rank's exit breaks it, each then printing a gloo
trace. Here every rank gathers every rank's outcome with one small all-gather: if any failed,
every rank raises the same error, the first failing rank's, at the same moment.
"""

import dataclasses
from typing import Any

from hpcddp import errors
from hpcddp.dist import collectives
from hpcddp.errors import HpcddpError, UserCodeError


@dataclasses.dataclass(frozen=True)
class Fault:
    """What went wrong on one rank: the error class to raise and its one-line message."""

    rank: int
    host: str
    kind: str  # the name of an `hpcddp.errors` class; anything else becomes UserCodeError
    message: str


def agree(fault: Fault | None, facts: Any = None) -> list[Any]:
    """Every rank's ``facts``, in rank order, once every rank reports no fault.

    Otherwise every rank raises the first failing rank's error (marked `errors.agreed`, so
    it is printed once), naming any other ranks that failed too.
    """
    gathered = collectives.all_gather_object((fault, facts))
    faults = [f for f, _ in gathered if f is not None]
    if faults:
        raise errors.agreed(as_error(faults))
    return [f for _, f in gathered]


def as_error(faults: list[Fault]) -> HpcddpError:
    """The first fault as its own error class, saying which other ranks failed too."""
    first = faults[0]
    others = sorted({f.rank for f in faults[1:] if f.message != first.message})
    also = ""
    if others:  # a fault every rank shares is everyone's: only other causes are worth naming
        ranks = f"rank {others[0]}" if len(others) == 1 else f"ranks {str(others)[1:-1]}"
        also = f" ({ranks} failed otherwise too: see RUN_DIR/logs)"
    message = first.message
    if also:  # before the HINT, so the line still ends with the fix
        head, hint, tail = message.partition(" HINT: ")
        stop = "." if head.endswith(".") else ""
        message = f"{head.removesuffix('.')}{also}{stop}{hint}{tail}"
    cls = getattr(errors, first.kind, None)
    if not (isinstance(cls, type) and issubclass(cls, HpcddpError)):
        cls = UserCodeError
    return cls(message)
