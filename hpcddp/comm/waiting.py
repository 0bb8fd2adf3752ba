"""A side group for waits that may outlast ``dist.timeout_s``: rank 0 writing a big checkpoint.

Every collective on the default group fails after ``dist.timeout_s`` (300 s), which is how a
hung peer ends a job. But the ranks that wait while rank 0 saves are not waiting on a hung
peer: they wait on a disk, and a 100 GB checkpoint on a shared file system can take longer
than that. So those waits go through a gloo group of their own whose timeout is
``dist.timeout_s`` plus the state's size at a pessimistic `MIN_WRITE_BYTES_PER_S`.
"""

import datetime

import torch.distributed as dist

MIN_WRITE_BYTES_PER_S = 25e6  # a slow, shared parallel file system on a bad day


def write_timeout_s(base_timeout_s: float, state_bytes: int) -> float:
    """How long a rank may wait for a write of ``state_bytes`` before calling it a hang."""
    return base_timeout_s + state_bytes / MIN_WRITE_BYTES_PER_S


def patient_group(timeout_s: float) -> "dist.ProcessGroup | None":
    """A gloo group of every rank with this timeout; None without a process group.

    Creating a group is a collective: every rank must call this at the same point.
    """
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
