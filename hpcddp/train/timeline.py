"""The start-up (and wind-down) timeline: seconds per phase, and the slowest rank in each.

A 64-rank job that takes minutes to start hides where: imports on a cold shared file system,
the rendezvous waiting for the last rank, the first step compiling kernels, a checkpoint on a
slow disk. Each rank times its own phases (`Timeline`); at the end rank 0 gets every rank's
times and the run summary records, per phase, the median and the slowest rank with its host
(`summarise`). A `Timeline` is a loop hook (`hpcddp.train.hooks`): the first step, evaluations
and saves are timed as the loop meets them; the rest by whoever runs the phase.
"""

import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psutil

from hpcddp.outcome import StopReason
from hpcddp.train.hooks import Hook, Stepped

if TYPE_CHECKING:
    from hpcddp.train.state import Progress

# In the order a run meets them. "import" is from process start to the trainer's first line.
PHASES = (
    "import",
    "env",
    "rendezvous",
    "setup",
    "buckets",
    "first_step",
    "evaluation",
    "checkpoint",
    "teardown",
)


def since_process_start() -> float:
    """Seconds since this process was created (interpreter start, imports, user code)."""
    return max(time.time() - psutil.Process().create_time(), 0.0)


class Timeline(Hook):
    """One rank's seconds per phase; a phase met several times (checkpoints) adds up."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.first_step = 1  # the attempt's first step (it compiles, warms caches)
        self.steps_ended = 0.0  # perf_counter when the steps ended: the wind-down starts

    def on_start(self, progress: "Progress") -> None:
        self.first_step = progress.step + 1

    def on_step(self, stepped: Stepped) -> None:
        if stepped.progress.step == self.first_step:
            self.add("first_step", stepped.seconds)

    def on_resume(self, phase: str, seconds: float) -> None:
        self.add(phase, seconds)  # an evaluation or a save

    def on_train_end(self, progress: "Progress", reason: StopReason | None) -> None:
        self.steps_ended = time.perf_counter()

    def wound_down(self) -> None:
        """The wind-down is over: its seconds since the steps ended are the "teardown"."""
        self.add("teardown", time.perf_counter() - self.steps_ended)

    def add(self, phase: str, seconds: float) -> None:
        """Count ``seconds`` towards ``phase``."""
        if phase not in self.seconds:
            raise ValueError(f"unknown phase {phase!r}; phases are {PHASES}")
        self.seconds[phase] += seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the body as ``name``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)


def summarise(per_rank: list[dict[str, float]], hosts: list[str]) -> dict[str, Any]:
    """Per phase: the median over ranks, the slowest rank, its host and its seconds."""
    timeline: dict[str, Any] = {}
    for phase in PHASES:
        times = [rank.get(phase, 0.0) for rank in per_rank]
        slowest = max(range(len(times)), key=times.__getitem__)
        timeline[phase] = {
            "median_s": round(statistics.median(times), 3),
            "max_s": round(times[slowest], 3),
            "slowest_rank": slowest,
            "slowest_host": hosts[slowest] if slowest < len(hosts) else "?",
        }
    return timeline


def table(timeline: dict[str, Any]) -> str:
    """The timeline as a small text table (for the log and the benchmark)."""
    lines = [f"{'phase':<12}{'median s':>10}{'max s':>10}  slowest rank (host)"]
    for phase, row in timeline.items():
        lines.append(
            f"{phase:<12}{row['median_s']:>10.3f}{row['max_s']:>10.3f}  "
            f"{row['slowest_rank']} ({row['slowest_host']})"
        )
    return "\n".join(lines)
