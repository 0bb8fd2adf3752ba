"""Turning a collective that failed because of another rank into one clear line.

When one rank dies, every other rank's next collective fails with a transport error; when
one rank hangs, they time out. Printing N tracebacks of that buries the one that matters (the
rank that failed first prints its own). Here the survivors say what happened in one line, and
after a timeout they try to name the ranks that never arrived.
"""

import datetime
import logging
import re

import torch.distributed as dist

from hpcddp.comm import sidegroup
from hpcddp.errors import DistributedError, PeerLostError
from hpcddp.launch.distenv import DistEnv

log = logging.getLogger(__name__)

_PEER_LOST = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|Connection refused|"
    r"NCCL communicator was aborted|remote process exited",
    re.I,
)
_TIMED_OUT = re.compile(
    r"Timed out waiting|timed out|Watchdog caught collective operation "
    r"timeout",
    re.I,
)
_PEER_ADDRESS = re.compile(r"\[([0-9a-fA-F.:]+)\]:(\d+)")


def missing_ranks(timeout_s: float = 10.0, backend: str = "gloo") -> str:
    """Best effort after a timeout: gloo's monitored barrier names ranks that do not arrive.

    NCCL has no monitored barrier; under NCCL it runs on the gloo side group
    (`hpcddp.comm.sidegroup`), if the run made one already (making it is itself a collective).
    """
    group = None if backend == "gloo" else sidegroup.made()
    if backend != "gloo" and group is None:
        return ""
    try:
        dist.monitored_barrier(
            group, timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True
        )
    except Exception as err:  # the message is the point: "Ranks 3 failed to pass ..."
        match = re.search(r"Ranks? [\d, ]+ failed to pass monitoredBarrier", str(err))
        return match.group(0) if match else ""
    return ""


def timed_out(err: BaseException) -> bool:
    """Whether ``err`` is a collective that gave up waiting (rather than a peer that left)."""
    return isinstance(err, RuntimeError) and bool(_TIMED_OUT.search(str(err)))


def explain(err: BaseException, env: DistEnv, timeout_s: float) -> BaseException:
    """A DistributedError for a failure caused by a peer; ``err`` itself otherwise."""
    text = str(err)
    if not isinstance(err, RuntimeError) or not dist.is_initialized():
        return err
    if _PEER_LOST.search(text):
        peer = _PEER_ADDRESS.search(text)
        where = f" (peer {peer.group(1)})" if peer else ""
        return PeerLostError(
            f"rank {env.rank} on {env.hostname} lost contact with another rank{where}: it died "
            "or was killed, and its own output or the launcher's names it. HINT: look for the "
            "first error in the job's output, or the last lines of RUN_DIR/logs/rank-*.log."
        )
    if _TIMED_OUT.search(text):
        absent = missing_ranks(backend=env.backend)
        return DistributedError(
            f"rank {env.rank} on {env.hostname} waited dist.timeout_s={timeout_s:.0f} s in a "
            f"collective that other ranks never reached{': ' + absent if absent else ''}. A rank "
            "is hung or stopped; every rank's stack is in RUN_DIR/logs/rank-*.log. HINT: raise "
            "dist.timeout_s only if some step legitimately takes that long."
        )
    return err
