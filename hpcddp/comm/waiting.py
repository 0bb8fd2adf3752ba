"""A side group for waits that may outlast ``dist.timeout_s``: rank 0 writing a big checkpoint.

Every collective on the default group fails after ``dist.timeout_s`` (300 s), which is how a
hung peer ends a job. But the ranks that wait while rank 0 saves are not waiting on a hung
peer: they wait on a disk, and a 100 GB checkpoint on a shared file system can take longer
than that. So those waits go through the gloo side group (`hpcddp.comm.sidegroup`) with a timeout of
``dist.timeout_s`` plus the state's size at a pessimistic `MIN_WRITE_BYTES_PER_S`.
"""

MIN_WRITE_BYTES_PER_S = 25e6  # a slow, shared parallel file system on a bad day


def write_timeout_s(base_timeout_s: float, state_bytes: int) -> float:
    """How long a rank may wait for a write of ``state_bytes`` before calling it a hang."""
    return base_timeout_s + state_bytes / MIN_WRITE_BYTES_PER_S
