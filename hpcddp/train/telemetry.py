"""Per-rank telemetry: where each rank's time and memory go, and which rank holds the job back.

One slow node makes every rank wait at each all-reduce, so the job's step time is the slowest
rank's, and the aggregate loss curve hides it. Each rank keeps its own clock between two
logging steps (`IntervalClock`: step time, time blocked on the DataLoader, the forward /
backward / optimizer split, samples and tokens, peak memory); at a logging step the ranks
gather these few numbers over a gloo side group, asynchronously, so the step never waits for
it (`RankFigures`); rank 0 reads them a step later and logs the job's figures with the slowest
rank, its host and how much more work per step it takes than the median rank (`summarise`).
"""

import contextlib
import resource
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from hpcddp.comm.sidegroup import side_group
from hpcddp.train.hooks import Hook
from hpcddp.train.state import Progress

# What each rank reports per interval, in this order (a float64 vector on the wire).
FIELDS = (
    "wall_s",  # the interval's length on this rank
    "steps",
    "data_wait_s",  # blocked in next(loader), summed over the interval
    "forward_s",
    "backward_s",
    "optimizer_s",
    "split_steps",  # steps whose forward / backward / optimizer split was measured
    "samples",
    "tokens",
    "rss_peak_bytes",
    "cuda_peak_bytes",
)


def peak_rss_bytes() -> int:
    """This process's peak resident memory (the kernel's high-water mark, no sampling)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


class IntervalClock(Hook):
    """One rank's figures between two logging steps, kept with perf_counter only.

    On the CPU every step's forward / backward / optimizer split is measured as it runs. On CUDA
    the host runs ahead of the GPU, so a split is only true if the device is waited for around
    each phase: that is done on the last step of each interval alone (`measures_split`), and
    every other step runs free. As a hook it leaves start-up, evaluations and saves out of the
    step times; the stepper feeds it the rest.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.totals = dict.fromkeys(FIELDS, 0.0)
        self.started = time.perf_counter()

    def measures_split(self, logging_next: bool) -> bool:
        """Whether to time this step's phases: always on the CPU, once per interval on CUDA."""
        return self.device.type != "cuda" or logging_next

    def phase(self, name: str, measured: bool) -> "contextlib.AbstractContextManager[None]":
        """Time the body as ``name`` (waiting for the device around it) if ``measured``."""
        return _Phase(self, name) if measured else _UNTIMED

    def add(self, phase: str, seconds: float) -> None:
        """Count ``seconds`` spent in ``phase`` (data_wait_s, forward_s, ...)."""
        self.totals[phase] += seconds

    def restart(self) -> None:
        """The interval starts now: start-up (the bucket-settling pass, the collector's one
        pass, opening files) is no step's time."""
        self.started = time.perf_counter()

    def exclude(self, seconds: float) -> None:
        """Leave ``seconds`` spent outside the steps (an evaluation, a save) out of step time."""
        self.started += seconds

    def on_start(self, progress: Progress) -> None:
        self.restart()

    def on_resume(self, phase: str, seconds: float) -> None:
        self.exclude(seconds)

    def step(self, samples: int, tokens: int, measured: bool) -> None:
        """One optimizer step done, with the samples and tokens it consumed on this rank."""
        self.totals["steps"] += 1
        self.totals["split_steps"] += measured
        self.totals["samples"] += samples
        self.totals["tokens"] += tokens

    def sync(self) -> None:
        """Wait for the device, so a phase timed around it is the phase's real length."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close_interval(self) -> torch.Tensor:
        """This interval's figures as a float64 vector; the clock starts the next interval."""
        now = time.perf_counter()
        self.totals["wall_s"] = now - self.started
        self.totals["rss_peak_bytes"] = float(peak_rss_bytes())
        if self.device.type == "cuda":  # this interval's peak: the counter starts again
            self.totals["cuda_peak_bytes"] = float(torch.cuda.max_memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
        vector = torch.tensor([self.totals[name] for name in FIELDS], dtype=torch.float64)
        self.totals = dict.fromkeys(FIELDS, 0.0)
        self.started = now
        return vector


class _Phase:
    """One timed phase; a plain class, as a generator-based context costs more on every step."""

    __slots__ = ("clock", "name", "started")

    def __init__(self, clock: IntervalClock, name: str) -> None:
        self.clock, self.name, self.started = clock, name, 0.0

    def __enter__(self) -> None:
        self.clock.sync()
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.clock.sync()
        self.clock.add(self.name, time.perf_counter() - self.started)


_UNTIMED = contextlib.nullcontext()


class RankFigures:
    """Gathers every rank's interval vector without making the training step wait.

    `start` posts an asynchronous all-gather on the gloo side group (`hpcddp.comm.sidegroup`,
    with ``timeout_s``); `finish` is asked after every step, and
    answers once the transfer has completed, which it waits for only at the next logging step,
    an evaluation or the end.
    """

    def __init__(
        self, rank: int, world_size: int, hosts: list[str], timeout_s: float = 300.0
    ) -> None:
        self.rank, self.world_size, self.hosts = rank, world_size, hosts
        self.timeout_s = timeout_s
        self.parts = [torch.zeros(len(FIELDS), dtype=torch.float64) for _ in range(world_size)]
        self.work: Any = None
        self.step = 0

    @property
    def pending(self) -> bool:
        """True between `start` and `finish`."""
        return self.step > 0

    def start(self, step: int, vector: torch.Tensor) -> None:
        """Send this rank's figures for the interval that ends at ``step``."""
        self.step = step
        if self.world_size == 1:
            self.parts[0].copy_(vector)
        else:
            group = side_group(self.timeout_s)
            self.work = dist.all_gather(self.parts, vector, group=group, async_op=True)

    def finish(self, wait: bool = True) -> dict[str, Any] | None:
        """The job's figures for the interval (rank 0), or None (other ranks, nothing pending).

        Without ``wait``, a gather still in flight is left to run: None now, ask again later.
        """
        if not self.pending:
            return None
        if self.work is not None:
            if not wait and not self.work.is_completed():
                return None
            self.work.wait()
            self.work = None
        step, self.step = self.step, 0
        if self.rank != 0:
            return None
        rows = [dict(zip(FIELDS, part.tolist(), strict=True)) for part in self.parts]
        return {"step": step, **summarise(rows, self.hosts)}


def summarise(rows: list[dict[str, float]], hosts: list[str]) -> dict[str, Any]:
    """The job's figures for one interval from every rank's row (rank order).

    Every rank's wall time per step is the same give or take: DDP makes the fast ranks wait
    for the slow one in the gradient all-reduce. So the slowest rank is found by its own work
    per step (`WORK_PHASES`, which never wait for a peer), and the step time is the median.
    """
    per_step = [_per_step(row) for row in rows]
    work = [row["work_s"] for row in per_step]
    median = statistics.median(work)
    slow = max(range(len(rows)), key=lambda r: work[r])
    wall = statistics.median(row["wall_s"] for row in rows) or 1e-9  # the ranks' interval
    figures: dict[str, Any] = {
        "step_time_s": round(statistics.median(row["step_time_s"] for row in per_step), 6),
        "work_s_min": round(min(work), 6),
        "work_s_median": round(median, 6),
        "work_s_max": round(work[slow], 6),
        "slowest_rank": slow,
        "slowest_host": hosts[slow] if slow < len(hosts) else "?",
        "slowest_vs_median": round(work[slow] / median, 3) if median > 0 else 1.0,
        "samples_per_s": round(sum(row["samples"] for row in rows) / wall, 2),
        "rss_gb_max": round(max(row["rss_peak_bytes"] for row in rows) / 1e9, 3),
    }
    for phase in ("data_wait_s", "forward_s", "backward_s", "optimizer_s"):
        figures[phase] = round(max(row[phase] for row in per_step), 6)
    tokens = sum(row["tokens"] for row in rows)
    if tokens:
        figures["tokens_per_s"] = round(tokens / wall, 1)
    cuda_peak = max(row["cuda_peak_bytes"] for row in rows)
    if cuda_peak:
        figures["cuda_gb_max"] = round(cuda_peak / 1e9, 3)
    return figures


# A rank's own work in a step: the phases in which it never waits for another rank (the
# backward holds the gradient all-reduce, where the fast ranks wait for the slow one).
WORK_PHASES = ("data_wait_s", "forward_s", "optimizer_s")


def _per_step(row: dict[str, float]) -> dict[str, float]:
    """Interval totals as seconds per step (the phases were measured on some steps only)."""
    steps = max(row["steps"], 1.0)
    split = max(row["split_steps"], 1.0)
    figures = {
        "step_time_s": row["wall_s"] / steps,
        "data_wait_s": row["data_wait_s"] / steps,
        "forward_s": row["forward_s"] / split,
        "backward_s": row["backward_s"] / split,
        "optimizer_s": row["optimizer_s"] / split,
    }
    figures["work_s"] = sum(figures[phase] for phase in WORK_PHASES)
    return figures
