"""Stopping a run cleanly: signals and the job's time limit, agreed by a vote of all ranks.

The signal handler only sets a flag: checkpointing inside a handler races the training step
and deadlocks collectives (Lightning#21406). Every so many steps the ranks vote (a MAX
all-reduce), so a signal that reached only some ranks still stops all of them at the same step.
The vote is started asynchronously after one step and read after the next, so it costs no wait;
and it is held only every N steps, N chosen so that votes are about `VOTE_EVERY_S` apart, so
a fast step does not pay for a collective it does not need (0.5 ms a step was measured, the
whole step of a small model). A signal is acted on within about `VOTE_EVERY_S` plus one step.
The job's end time and requeueing live in `hpcddp.resilience.deadline` and
`hpcddp.resilience.requeue`.
"""

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from hpcddp.comm.sidegroup import side_group
from hpcddp.outcome import StopReason

log = logging.getLogger(__name__)

# SIGUSR1 is avoided on purpose: NCCL may catch it (nccl#704). Slurm's --signal uses USR2 here.
STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


class StopFlag:
    """Records stop signals; a second Ctrl-C raises KeyboardInterrupt for users who insist,
    except while a checkpoint is being written (`shielded`): then it waits for the write; and
    except once every rank has agreed to stop (`agreed`): the stop under way is the fastest
    clean end. A rank that left on its own then would leave its peers failing in the stop's
    collectives (a clean stop reported as a crash, exit 1 or SIGABRT, seen under load)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self._previous: dict[int, Any] = {}
        self._shields = 0
        self.deferred = False  # a second Ctrl-C came while shielded
        self.agreed = False  # every rank is stopping (`hpcddp.train.stopping`)

    def install(self) -> "StopFlag":
        """Take over the stop signals (main thread only)."""
        global _installed
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        _installed = self
        return self

    def uninstall(self) -> None:
        """Give the signals back to whoever had them."""
        global _installed
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if _installed is self:
            _installed = None

    @contextlib.contextmanager
    def shielded(self, finish: Callable[[], None] | None = None) -> Iterator[None]:
        """Within: a second Ctrl-C is held back; on leaving, ``finish()`` (the rest of the
        write, if it goes on in the background), then KeyboardInterrupt."""
        self._shields += 1
        try:
            yield
        finally:
            self._shields -= 1
        if self.deferred and self._interrupts_now():
            if finish is not None:
                finish()
            self.deferred = False
            raise KeyboardInterrupt

    def _interrupts_now(self) -> bool:
        """Whether an insisting Ctrl-C ends this rank at once: no write to finish, no stop
        every rank is already carrying out."""
        return not self._shields and not self.agreed

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and signal.SIGINT in self.seen:
            if self._interrupts_now():
                raise KeyboardInterrupt
            if not self.deferred:
                log.info("Ctrl-C again: stopping once the checkpoint being written is complete")
            self.deferred = True
        self.seen.add(signum)


# Signal handlers belong to the process, so the flag that holds them does too: the checkpoint
# code shields its writes through `shielded` without being handed the flag.
_installed: StopFlag | None = None


@contextlib.contextmanager
def shielded(finish: Callable[[], None] | None = None) -> Iterator[None]:
    """`StopFlag.shielded` of the installed flag; nothing to shield when none is installed."""
    flag = _installed
    if flag is None:
        yield
        return
    with flag.shielded(finish):
        yield


VOTE_EVERY_S = 0.5  # seconds between votes; a stop is acted on within about this
MAX_VOTE_INTERVAL_STEPS = 10_000


class StopVote:
    """Every N steps: did any rank see a reason to stop? Every rank gets the same answer.

    The flag lives on the CPU and, under nccl, travels over a gloo side group: reading a GPU
    tensor would wait for the step just queued on the device. Beside the reason each rank
    sends its seconds per step since the last vote; the MAX of those, the same on every rank,
    sets when the next vote is held, so every rank votes at the same steps.
    """

    def __init__(
        self,
        backend: str,
        distributed: bool,
        every_s: float = VOTE_EVERY_S,
        timeout_s: float = 300.0,
    ) -> None:
        self._flag = torch.zeros(2, dtype=torch.float64)  # reason, seconds per step
        self._work = None
        self._distributed = distributed
        self._every_s = every_s
        self.pending = False  # cast, not yet read
        self._soon = False  # a pause since the last cast: vote again right after the next step
        self.next_step = 1  # the first vote: after step 1
        self._cast_at, self._since = 0, time.perf_counter()
        self._side = distributed and backend != "gloo"  # else the default (gloo) group
        self._timeout_s = timeout_s

    def restart(self, step: int) -> None:
        """After a pause every rank took together (a checkpoint, an evaluation): vote after the
        next step, and time steps from now, so a long pause neither delays a stop for long nor
        counts as a slow step."""
        self.next_step, self._soon = min(self.next_step, step + 1), True
        self._cast_at, self._since = step, time.perf_counter()

    def due(self, step: int) -> bool:
        """Is a vote held after ``step``?"""
        return step >= self.next_step and not self.pending

    def cast(self, reason: StopReason | None, step: int) -> None:
        """Start the vote after ``step`` (None = carry on) without waiting for it."""
        now = time.perf_counter()
        self._flag[0] = int(reason or 0)
        self._flag[1] = (now - self._since) / max(step - self._cast_at, 1)
        self._cast_at, self._since, self.pending = step, now, True
        if self._distributed:
            self._work = dist.all_reduce(
                self._flag,
                op=dist.ReduceOp.MAX,
                group=side_group(self._timeout_s) if self._side else None,
                async_op=True,
            )

    def result(self) -> StopReason | None:
        """The highest reason any rank voted at the last `cast` (waits for it); None if none."""
        if not self.pending:
            return None
        if self._work is not None:
            self._work.wait()
            self._work = None
        self.pending = False
        reason, per_step_s = int(self._flag[0]), float(self._flag[1])
        interval = round(self._every_s / max(per_step_s, 1e-9))
        interval = 1 if self._soon else min(max(interval, 1), MAX_VOTE_INTERVAL_STEPS)
        self.next_step, self._soon = self._cast_at + interval, False
        return StopReason(reason) if reason else None


def reason_of(flag: StopFlag, deadline: float | None) -> StopReason | None:
    """This rank's vote from its signals and the job's time limit (None: carry on).

    Only a preemption (USR2, the time limit) requeues; SIGTERM is also what `scancel` sends,
    and a cancelled job must stay cancelled, so it outranks the others (`StopReason`).
    """
    if signal.SIGTERM in flag.seen:
        return StopReason.TERMINATED
    if signal.SIGUSR2 in flag.seen or (deadline is not None and time.time() >= deadline):
        return StopReason.PREEMPTED
    if signal.SIGINT in flag.seen:
        return StopReason.INTERRUPTED
    return None
