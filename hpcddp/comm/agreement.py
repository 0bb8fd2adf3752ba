"""An agreement point: every rank says whether its own part worked, and all learn it at once.

Work each rank does on its own (building the model and data from user factories) can fail on
one rank only. Without a meeting, the others walk into the next collective (DDP's broadcast of
the weights) and wait there until the failing rank's exit breaks it, each then printing a gloo
trace. Here every rank gathers every rank's outcome with one small all-gather: if any failed,
every rank raises the same error, the first failing rank's, at the same moment.
"""

import dataclasses
import itertools
from typing import Any

import torch.distributed as dist

from hpcddp import errors
from hpcddp.comm import collectives, failures
from hpcddp.errors import DistributedError, HpcddpError, UserCodeError
from hpcddp.launch.distenv import DistEnv

_rounds = itertools.count()  # every rank agrees the same number of times


@dataclasses.dataclass(frozen=True)
class Fault:
    """What went wrong on one rank: the error class to raise and its one-line message."""

    rank: int
    host: str
    kind: str  # the name of an `hpcddp.errors` class; anything else becomes UserCodeError
    message: str


def agree(
    fault: Fault | None,
    facts: Any = None,
    *,
    env: DistEnv,
    timeout_s: float,
    doing: str = "their part",
) -> list[Any]:
    """Every rank's ``facts``, in rank order, once every rank reports no fault.

    Otherwise every rank raises the first failing rank's error (marked `errors.agreed`, so
    it is printed once), naming any other ranks that failed too. A rank that never arrives
    (hung in ``doing``) is named after ``timeout_s``; one that died, in a line, not a trace.
    """
    key = f"hpcddp/agree/{env.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_rounds)}"
    store = _store()
    if store is not None:
        store.set(f"{key}/{env.rank}", "1")  # who arrived, for naming who did not
    try:
        gathered = collectives.all_gather_object((fault, facts))
    except RuntimeError as err:
        if store is not None and failures.timed_out(err):
            raise DistributedError(_absent(store, key, env, timeout_s, doing)) from err
        explained = failures.explain(err, env, timeout_s)  # a peer that died, say
        if explained is err:
            raise
        raise explained from err
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


def _store() -> Any:
    """The process group's store (None without a group of more than one rank)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return None
    return dist.distributed_c10d._get_default_store()


def _absent(store: Any, key: str, env: DistEnv, timeout_s: float, doing: str) -> str:
    """The line for a timeout at the agreement: which ranks never arrived, and what they do."""
    missing = [r for r in range(env.world_size) if not store.check([f"{key}/{r}"])]
    who = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {str(missing)[1:-1]}"
    return (
        f"rank {env.rank} on {env.hostname} waited dist.timeout_s={timeout_s:.0f} s for "
        f"{who if missing else 'another rank'} to finish {doing}: it is hung or slow there "
        "(a stalled download or file system?). HINT: its log (RUN_DIR/logs/rank-R.log) shows "
        "how far it got; raise dist.timeout_s only if that work legitimately takes longer."
    )
