"""What a run cost, attempt by attempt, from what the run recorded (`hpcddp.records.attempts`).

An attempt's wall time runs from when its rank 0 process started to when it ended (its line in
``attempts.jsonl``); for an attempt that died, the start comes from ``starts.jsonl`` (written
after each attempt's first step). Time lost before an attempt's first new step is split in
three: ``detect_s`` (the failure before it detected, to every rank gone), ``waited_s`` (the
attempt before it ended, to this one's start: requeue hold, pending, the job's start) and
``startup_s`` (its start to its first step done). ``training_s`` is the time spent on steps
that were kept: from its checkpoint loaded to its end, or, for an attempt that failed (whose
steps after the last checkpoint are lost), its steps kept at the run's own pace.

Torch-free: ``hpcddp report`` runs on the login node.
"""

import dataclasses
import os
from typing import Any

from hpcddp.records import attempts


@dataclasses.dataclass(frozen=True)
class AttemptCost:
    """One attempt: what it held, how long, what it gained and what was lost before it."""

    attempt: int
    job: str
    restart: int
    cause: str
    nodes: int  # allocated, spares included
    gpus: int
    started: float | None  # rank 0's process start (epoch seconds); None: never stepped
    ended: float
    steps_gained: int
    detect_s: float  # the failure before it: detected to ranks gone
    waited_s: float | None  # the attempt before it ended, to this one's start
    startup_s: float | None  # its start to its first step done
    training_s: float  # time on steps that were kept

    @property
    def wall_s(self) -> float:
        """Allocated time as the run saw it (0 when its start is unknown)."""
        return max(self.ended - self.started, 0.0) if self.started is not None else 0.0

    @property
    def lost_s(self) -> float:
        """From the failure or stop before it to its first new step (0 for the first attempt,
        whose start-up is in ``startup_s`` alone)."""
        if self.attempt == 1:
            return 0.0
        return self.detect_s + (self.waited_s or 0.0) + (self.startup_s or 0.0)

    @property
    def node_hours(self) -> float:
        """Nodes x wall time."""
        return self.nodes * self.wall_s / 3600

    @property
    def gpu_hours(self) -> float:
        """GPUs x wall time."""
        return self.gpus * self.wall_s / 3600

    @property
    def useful_share(self) -> float:
        """Training time over allocated time (0 when unknown)."""
        return min(self.training_s / self.wall_s, 1.0) if self.wall_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Every field and derived figure, for ``--json``."""
        derived = ("wall_s", "lost_s", "node_hours", "gpu_hours", "useful_share")
        return {**dataclasses.asdict(self), **{name: getattr(self, name) for name in derived}}


@dataclasses.dataclass(frozen=True)
class Totals:
    """A run's (or a sweep's) attempts added up."""

    attempts: int
    steps_gained: int
    wall_s: float
    startup_s: float
    lost_s: float
    training_s: float
    node_hours: float
    gpu_hours: float

    @classmethod
    def of(cls, costs: list[AttemptCost]) -> "Totals":
        """The sums over ``costs``."""
        return cls(
            attempts=len(costs),
            steps_gained=sum(c.steps_gained for c in costs),
            **{
                name: sum(getattr(c, name) for c in costs)
                for name in ("wall_s", "lost_s", "training_s", "node_hours", "gpu_hours")
            },
            startup_s=sum(c.startup_s or 0.0 for c in costs),
        )

    @classmethod
    def added(cls, parts: list["Totals"]) -> "Totals":
        """Several runs' totals added (a sweep's)."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: sum(getattr(t, name) for t in parts) for name in names})

    @property
    def useful_share(self) -> float:
        """Training time over allocated time, over every attempt."""
        return min(self.training_s / self.wall_s, 1.0) if self.wall_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The sums and the useful share, for ``--json``."""
        return {**dataclasses.asdict(self), "useful_share": self.useful_share}


def run_costs(run_dir: str | os.PathLike[str]) -> list[AttemptCost]:
    """Every recorded attempt of the run in ``run_dir``, costed."""
    ended = attempts.records(run_dir)
    starts = attempts.records(run_dir, attempts.STARTS)
    joined = [_with_start(r, starts, ended[i - 1] if i else None) for i, r in enumerate(ended)]
    pace = _seconds_per_step(joined)
    gpus_per_node = max((_gpus(r) / _nodes(r) for r in joined if _gpus(r)), default=0.0)
    return [
        _cost(number, r, joined[number - 2] if number > 1 else None, pace, gpus_per_node)
        for number, r in enumerate(joined, start=1)
    ]


def _with_start(
    record: dict[str, Any], starts: list[dict[str, Any]], before: dict[str, Any] | None
) -> dict[str, Any]:
    """An attempt's record with its start times: its own, or the start line written between
    the end of the attempt before it and its own end (the policy helper records a dead
    attempt without them)."""
    if "started" in record:
        return record
    after = float(before.get("time", 0.0)) if before else 0.0
    end = float(record.get("time", 0.0))
    mine = [s for s in starts if after < float(s.get("time", 0.0)) <= end]
    if not mine:
        return record
    names = ("started", "loaded", "first_step", "gpus")
    found: dict[str, Any] = {k: mine[-1][k] for k in names if k in mine[-1]}
    return {**found, **record}


def _nodes(record: dict[str, Any]) -> int:
    return int(record.get("allocated_nodes") or len(record.get("nodes", [])) or 1)


def _gpus(record: dict[str, Any]) -> int:
    return int(record.get("gpus", 0))


def _kept_whole(record: dict[str, Any]) -> bool:
    """Every step of an attempt that did not fail was kept (it saved a checkpoint at its end)."""
    return not str(record.get("cause", "")).startswith("failed")


def _seconds_per_step(records: list[dict[str, Any]]) -> float | None:
    """The run's pace on attempts whose steps were all kept (None when there are none)."""
    spent = gained = 0.0
    for r in records:
        steps = int(r.get("step", 0)) - int(r.get("from_step", 0))
        if _kept_whole(r) and "loaded" in r and steps > 0:
            spent += float(r["time"]) - float(r["loaded"])
            gained += steps
    return spent / gained if gained else None


def _cost(
    number: int,
    r: dict[str, Any],
    before: dict[str, Any] | None,
    pace: float | None,
    gpus_per_node: float,
) -> AttemptCost:
    started = float(r["started"]) if "started" in r else None
    ended = float(r.get("time", 0.0))
    steps = max(int(r.get("step", 0)) - int(r.get("from_step", 0)), 0)
    detect = 0.0
    if before is not None and "detected" in before:
        detect = max(float(before["time"]) - float(before["detected"]), 0.0)
    waited = None
    if before is not None and started is not None:
        waited = max(started - float(before["time"]), 0.0)
    first = r.get("first_step")
    return AttemptCost(
        attempt=number,
        job=str(r.get("job", "")),
        restart=int(r.get("restart", 0)),
        cause=str(r.get("cause", "")),
        nodes=_nodes(r),
        gpus=_gpus(r) or round(gpus_per_node * _nodes(r)),
        started=started,
        ended=ended,
        steps_gained=steps,
        detect_s=detect,
        waited_s=waited,
        startup_s=float(first) - started if first is not None and started is not None else None,
        training_s=_training_s(r, steps, pace),
    )


def _training_s(r: dict[str, Any], steps: int, pace: float | None) -> float:
    """Time on kept steps: loaded to end, or for a failed attempt its kept steps at the run's
    pace (at most the time it trained before the failure was seen)."""
    if "loaded" not in r or steps == 0:
        return 0.0
    trained = float(r.get("detected", r["time"])) - float(r["loaded"])
    if _kept_whole(r):
        return max(trained, 0.0)
    return max(min(steps * pace, trained) if pace is not None else trained, 0.0)
