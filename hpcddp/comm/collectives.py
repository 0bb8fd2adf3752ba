"""Small collectives that keep every rank in step around work only some ranks do.

The classic hang: rank 0 fails inside ``if rank == 0:`` and the others wait on the next
collective until its timeout. Here the doer's outcome is broadcast, so every rank raises the
same error at once. Object collectives run on the gloo side group (`hpcddp.comm.sidegroup`)
unless told otherwise: never on NCCL, where they would need CUDA tensors.
"""

from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch.distributed as dist

from hpcddp import errors
from hpcddp.comm.sidegroup import side_group
from hpcddp.errors import HpcddpError

T = TypeVar("T")


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    """Every rank gets ``src``'s object (identity without a process group)."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group if group is not None else side_group())
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's object, in rank order (``[obj]`` without a process group)."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=side_group())
    return out


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's object, in rank order, on ``dst`` only (None elsewhere)."""
    if not _active():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst, group=side_group())
    return out


def on_rank_zero(fn: Callable[[], T], rank: int, what: str, group: Any = None) -> T:
    """Run ``fn`` on rank 0 only; every rank gets its result, or raises the same error at once.

    An hpcddp error (a refusal, say) is raised as the very same error on every rank, so the job
    ends with one message and one exit status; anything else names rank 0 and what it did.
    The others wait on ``group`` (default: the side group with the job's timeout).
    """
    result, failure = None, None
    if rank == 0:
        try:
            result = fn()
        except Exception as err:  # reported to every rank below, then re-raised here
            failure = err
    told = None if failure is None else (type(failure).__name__, str(failure))
    result, told = broadcast_object((result, told), group=group)
    if failure is not None:
        raise failure
    if told is not None:
        raise _same_error(told[0], told[1], what)
    return cast(T, result)


def _same_error(kind: str, message: str, what: str) -> Exception:
    """Rank 0's error, rebuilt on another rank: the same class for hpcddp's own errors."""
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, HpcddpError):
        return cls(message)
    return HpcddpError(f"rank 0 failed to {what}: {kind}: {message}")
