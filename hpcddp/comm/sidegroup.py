"""One gloo group of every rank beside the training's own, made on first use, shared by all.

Why one: each group is a full mesh of connections (world size - 1 per rank) set up through
the store when it is created, so every extra group lengthens start-up and every restart.
Telemetry, checkpoint waits, download guards, the stop vote under NCCL and every object
collective (agreements, rank 0's outcomes) share this one. Why gloo: an object collective on
an NCCL group moves CUDA tensors and, when a peer is gone, dies by the NCCL watchdog without a
Python exception; on gloo it raises, and the rank that is missing can be named.
Why on first use: a run that never needs it (a world of one) connects nothing.

Its timeout is the one the caller at hand asks for (`side_group`): a checkpoint wait may need
longer than ``dist.timeout_s``, a download its own. Collectives on one group must be issued in
the same order on every rank; every user calls from the main thread at points every rank
reaches in the same order, as it must for any collective.
"""

import datetime
import weakref
from typing import Any

import torch
import torch.distributed as dist

_made: dict[str, Any] = {}  # "world": weakref to the group it was made for, "group": the group


def side_group(timeout_s: float | None = None) -> "dist.ProcessGroup | None":
    """The side group with ``timeout_s`` (the job's own when None); None without a group.

    The first call is a collective (it creates the group): every rank must make it at the
    same point, as it must make the collective it is for.
    """
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    timeout = job_timeout() if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    world, group = _made.get("world"), _made.get("group")
    if world is None or world() is not dist.group.WORLD or group is None:
        group = dist.new_group(backend="gloo", timeout=timeout)
        _made.update(world=weakref.ref(dist.group.WORLD), group=group)
    elif _timeout_of(group) != timeout:
        dist.distributed_c10d._set_pg_timeout(timeout, group)
    return group


def made() -> "dist.ProcessGroup | None":
    """The side group if this world already made it (None otherwise): making it is a
    collective, which a hung rank would never join."""
    world, group = _made.get("world"), _made.get("group")
    if not dist.is_initialized() or world is None or world() is not dist.group.WORLD:
        return None
    return group


def job_timeout() -> datetime.timedelta:
    """The default group's timeout: ``dist.timeout_s``, as `hpcddp.comm.group` joined with."""
    return _timeout_of(dist.group.WORLD)


def _timeout_of(group: Any) -> datetime.timedelta:
    device = torch.device("cuda") if torch.device("cuda") in group._device_types else "cpu"
    return group._get_backend(torch.device(device)).options._timeout
