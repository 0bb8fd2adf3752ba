"""What a hang is, and who caused it: the watchdog's rules, free of threads, stores and clocks.

A rank hangs when its step counter stops moving for longer than its phase allows
(``dist.hang_timeout_s``; the first step, evaluations and checkpoint saves get
``dist.hang_slow_phase_s``). Once one rank hangs, every other rank soon waits for it inside a
collective, so every rank's watchdog sees a stall at about the same time. Each then reports
its last completed step and whether its main thread waits inside a collective; `behind` reads
the reports and names the ranks the others wait for. `hpcddp.comm.watchdog` runs these rules
in a thread; the clock is passed in, so the unit tests drive them with a fake one.
"""

import dataclasses
import pathlib
import sysconfig
from collections.abc import Collection, Mapping
from types import FrameType

FIRST_STEP = "first step"
STEPS = "steps"
SLOW_PHASES = ("checkpoint", "evaluation")  # the loop's own names for what it times apart

# Where a main thread waits for the other ranks: torch's collectives, the autograd engine (DDP
# waits for its gradient all-reduce at the end of backward) and hpcddp's own waits.
_WAITING_IN = ("torch/distributed/", "torch/autograd/", "hpcddp/comm/")
# Frames of Python's own library (threading, queue, selectors) say how a thread waits, not
# whose wait it is: the first frame outside it does.
_STDLIB = pathlib.PurePath(sysconfig.get_paths()["stdlib"]).as_posix() + "/"


@dataclasses.dataclass
class Beat:
    """What the training thread tells the watchdog: plain attributes, read by its thread.

    Writing one costs an attribute store: the step loop pays nothing measurable for it.
    """

    step: int = 0
    phase: str = STEPS


@dataclasses.dataclass(frozen=True)
class Budget:
    """Seconds without progress that count as a hang: in steady steps, and in slow phases."""

    steady_s: float
    slow_s: float

    @classmethod
    def from_config(cls, hang_timeout_s: float, hang_slow_phase_s: float) -> "Budget":
        """The config's two keys; a slow phase defaults to ten steady budgets."""
        return cls(hang_timeout_s, hang_slow_phase_s or 10 * hang_timeout_s)


class StallTimer:
    """How long this rank's step and phase have stood still, by the clock the caller reads."""

    def __init__(self, budget: Budget, first_step: int, now: float) -> None:
        self.budget, self.first_step = budget, first_step
        self.seen: tuple[int, str] = (first_step, STEPS)
        self.since = now

    def stalled_s(self, step: int, phase: str, now: float) -> float | None:
        """Seconds without progress once they exceed the phase's budget; None within it."""
        if (step, phase) != self.seen:  # a step done, or a phase begun or ended: progress
            self.seen, self.since = (step, phase), now
            return None
        waited = now - self.since
        return waited if waited > self.allowed_s(step, phase) else None

    def allowed_s(self, step: int, phase: str) -> float:
        """The budget of where the rank is: the first step and slow phases get the long one."""
        slow = step == self.first_step or phase in SLOW_PHASES
        return self.budget.slow_s if slow else self.budget.steady_s


@dataclasses.dataclass(frozen=True)
class Report:
    """One rank's account of its stall, as it publishes it to the others."""

    rank: int
    host: str
    step: int  # its last completed step
    phase: str
    waiting: bool  # its main thread waits inside a collective: it is not the cause
    where: str = ""  # its main thread's innermost frame, ``file:line in function``
    stalled_s: float = 0.0


def behind(reports: Mapping[int, Report], world_size: int, done: Collection[int] = ()) -> list[int]:
    """The ranks the others wait for.

    A rank that sent no report and did not finish training (``done``: a hang in the last step
    leaves the others past it) hangs so hard its own watchdog cannot run (it holds the
    interpreter): it is behind. Otherwise the ranks at the lowest completed step, and of those
    the ones not waiting inside a collective, if any; if every rank waits, all of the lowest.
    """
    silent = [rank for rank in range(world_size) if rank not in reports and rank not in done]
    if silent:
        return silent
    lowest = min(r.step for r in reports.values())
    last = sorted(rank for rank, r in reports.items() if r.step == lowest)
    outside = [rank for rank in last if not reports[rank].waiting]
    return outside or last


def _filename(frame: FrameType) -> str:
    return pathlib.PurePath(frame.f_code.co_filename).as_posix()


def own_frame(frame: FrameType | None) -> FrameType | None:
    """A thread's innermost frame outside Python's own library (the innermost if all are)."""
    found = frame
    while found is not None and _filename(found).startswith(_STDLIB):
        found = found.f_back
    return found or frame


def innermost(frame: FrameType | None) -> str:
    """``file:line in function`` of a thread's innermost frame outside Python's library."""
    frame = own_frame(frame)
    if frame is None:
        return "no Python frame"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def waiting_in_collective(frame: FrameType | None) -> bool:
    """Whether a thread's innermost own frame (`own_frame`) waits for others (_WAITING_IN)."""
    frame = own_frame(frame)
    return frame is not None and any(part in _filename(frame) for part in _WAITING_IN)


def message(hung: list[Report], silent: list[int], budget_s: float, stacks: str) -> str:
    """The one console line: which rank hung where, and where every rank's stacks are."""
    named = [f"rank {r.rank} on {r.host} after step {r.step} (at {r.where})" for r in hung]
    named += [f"rank {rank} (silent: it holds the interpreter)" for rank in silent]
    return (
        f"hang: {'; '.join(named)}: no progress for {budget_s:.0f} s while the others wait for "
        f"it; every rank's stacks are in {stacks}. Ending it as a rank death (a Slurm job then "
        "goes on without its node). HINT: the stacks show the hung frame; raise "
        "dist.hang_timeout_s only if a step legitimately takes that long."
    )
