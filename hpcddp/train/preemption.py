"""Stopping a run cleanly: signals and the job's time limit, agreed by a vote of all ranks.

The signal handler only sets a flag: checkpointing inside a handler races the training step
and deadlocks collectives (Lightning#21406). At each step boundary the ranks vote (a MAX
all-reduce), so a signal that reached only some ranks still stops all of them at the same step.
The vote is started asynchronously after one step and read after the next, so it costs no wait.
The job's end time and requeueing live in `hpcddp.launch.deadline` and `hpcddp.launch.requeue`.
"""

import logging
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# SIGUSR1 is avoided on purpose: NCCL may catch it (nccl#704). Slurm's --signal uses USR2 here.
STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


class StopFlag:
    """Records stop signals; a second Ctrl-C raises KeyboardInterrupt for users who insist."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self._previous: dict[int, Any] = {}

    def install(self) -> "StopFlag":
        """Take over the stop signals (main thread only)."""
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def uninstall(self) -> None:
        """Give the signals back to whoever had them."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and signal.SIGINT in self.seen:
            raise KeyboardInterrupt
        self.seen.add(signum)


class StopVote:
    """Each step: did any rank see a reason to stop? Every rank gets the same answer.

    The flag lives on the CPU and, under nccl, travels over a gloo side group: reading a GPU
    tensor would wait for the step just queued on the device, every step.
    """

    def __init__(self, backend: str, distributed: bool) -> None:
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._work = None
        self._distributed = distributed
        # creating a group is a collective: every rank builds its StopVote at the same point
        self._group = dist.new_group(backend="gloo") if distributed and backend != "gloo" else None

    def cast(self, reason: int) -> None:
        """Start this step's vote (0 = carry on) without waiting for it."""
        self._flag.fill_(reason)
        if self._distributed:
            self._work = dist.all_reduce(
                self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True
            )

    def result(self) -> int:
        """The highest reason any rank voted at the last `cast` (waits for it)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        return int(self._flag.item())


# Vote values, highest wins. Only a preemption (USR2, the time limit) requeues; SIGTERM is
# also what `scancel` sends, and a cancelled job must stay cancelled, so it outranks all.
CARRY_ON, STOP_REQUESTED, STOP_INTERRUPTED, STOP_PREEMPTED, STOP_TERMINATED = 0, 1, 2, 3, 4
REASON_NAMES = {
    STOP_REQUESTED: "requested",
    STOP_INTERRUPTED: "interrupted",
    STOP_TERMINATED: "terminated",
    STOP_PREEMPTED: "preempted",
}


def reason_of(flag: StopFlag, deadline: float | None) -> int:
    """This rank's vote from its signals and the job's time limit."""
    if signal.SIGTERM in flag.seen:
        return STOP_TERMINATED
    if signal.SIGUSR2 in flag.seen or (deadline is not None and time.time() >= deadline):
        return STOP_PREEMPTED
    if signal.SIGINT in flag.seen:
        return STOP_INTERRUPTED
    return CARRY_ON
