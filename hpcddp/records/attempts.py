"""Every attempt of a run across requeues: where it ran, why it ended, how many steps it gained.

``RUN_DIR/attempts.jsonl`` gets one line per attempt, once it ended: written by rank 0 when the
run stops or finishes, or by the job script's policy helper (`hpcddp.slurm.policy`) when a rank
died, since a dead rank writes nothing. `history` lists them for the run's summary.

Recovery is timed too. A failed attempt's line holds when the failure was detected (the hang
watchdog's verdict; a death is seen as the step ends) and its ``time``, when all its ranks were
gone. Rank 0 of every attempt writes a line to ``RUN_DIR/starts.jsonl`` after
its first step (when its process started, when its checkpoint was loaded, when that first
step was done); every attempt's own line holds the same times when it ends. `last_recovery`
pairs the last failure with the first start after it, for `hpcddp status`, while the new
attempt still runs.

Torch-free, so the job script's helper can read it without importing torch.
"""

import dataclasses
import json
import logging
import os
import pathlib
import time
from typing import Any

from hpcddp import run_files
from hpcddp.storage.checkpoint_names import (
    CHECKPOINT_NAME,
    has_sidecar,
    sharded_complete_steps,
)

log = logging.getLogger(__name__)

FILE = run_files.ATTEMPTS
STARTS = run_files.STARTS


def saved_step(run_dir: str | os.PathLike[str]) -> int:
    """The step of the newest complete checkpoint in the run directory (0 when none)."""
    folder = pathlib.Path(run_dir) / run_files.CHECKPOINTS
    try:
        names = set(os.listdir(folder))
    except OSError:
        return 0
    complete = [m for n in names if (m := CHECKPOINT_NAME.match(n)) and has_sidecar(n, names)]
    steps = [int(m[1]) for m in complete] + sharded_complete_steps(folder)
    return max(steps, default=0)


def _append(run_dir: str | os.PathLike[str], record: dict[str, Any], name: str = FILE) -> None:
    """One JSON line, written whole with one write(); a torn last line is skipped on read, and
    the next line starts on a line of its own."""
    line = json.dumps({**record, "time": round(time.time(), 3)}) + "\n"
    with open(pathlib.Path(run_dir) / name, "a+b") as out:
        if out.seek(0, os.SEEK_END) > 0:
            out.seek(-1, os.SEEK_END)
            if out.read(1) != b"\n":
                line = "\n" + line
        out.write(line.encode())
        out.flush()
        os.fsync(out.fileno())


def last_step(run_dir: str | os.PathLike[str]) -> int:
    """The step the last recorded attempt reached: where the next one starts (0 at first)."""
    found = records(run_dir)
    return int(found[-1].get("step", 0)) if found else 0


@dataclasses.dataclass(frozen=True)
class Ended:
    """One attempt once it ended: where it ran, why it ended, the steps it spanned.

    ``step`` defaults to the newest saved checkpoint (what the next attempt resumes from),
    ``from_step`` to where the previous attempt ended. ``then`` is what the job did next
    after a failure: ``restart`` (in the same job, on a spare node), ``requeue`` or ``stop``.
    ``times`` are its recovery times (``detected`` for a failure; ``started``, ``loaded``,
    ``first_step`` for its start). ``size`` is what it held: ``gpus``, ``allocated_nodes``
    (spares included), for its cost (`hpcddp.records.cost`). ``shrank``: ``from_nodes`` and
    ``to_nodes`` when the job went on with fewer nodes (``slurm.shrink_on_failure``).
    """

    job: str
    restart: int
    nodes: list[str]
    cause: str
    step: int | None = None
    from_step: int | None = None
    excluded: list[str] | None = None
    then: str | None = None
    times: dict[str, float] | None = None
    size: dict[str, int] | None = None
    shrank: dict[str, int] | None = None


def record(run_dir: str | os.PathLike[str], ended: Ended) -> None:
    """Record one attempt once it ended (`Ended`), as one line of attempts.jsonl."""
    e = ended
    entry: dict[str, Any] = {"job": e.job, "restart": e.restart, "nodes": e.nodes, "cause": e.cause}
    entry["from_step"] = last_step(run_dir) if e.from_step is None else e.from_step
    entry["step"] = saved_step(run_dir) if e.step is None else e.step
    if e.excluded:
        entry["excluded"] = e.excluded
    if e.then:
        entry["then"] = e.then
    if e.shrank:
        entry["shrank"] = e.shrank
    entry.update(e.times or {})
    entry.update(e.size or {})
    _append(run_dir, entry)


def record_start(
    run_dir: str | os.PathLike[str],
    *,
    job: str,
    restart: int,
    times: dict[str, float],
    size: dict[str, int] | None = None,
) -> None:
    """Rank 0, after its attempt's first step: the times of its start (see the docstring)."""
    _append(run_dir, {"job": job, "restart": restart, **times, **(size or {})}, STARTS)


def hang_dir(run_dir: str | os.PathLike[str], job: str, restart: int) -> pathlib.Path:
    """Where one attempt's hang watchdog writes every rank's stacks and its verdict."""
    return pathlib.Path(run_dir) / run_files.LOGS / "hang" / f"job-{job or 'local'}.{restart}"


def take_hang_verdict(
    run_dir: str | os.PathLike[str], job: str, restart: int
) -> dict[str, Any] | None:
    """The attempt's hang verdict (`hpcddp.comm.watchdog`), if its watchdog found a hang.

    Taken once: a ``verdict.taken`` marker beside it says it was acted on, so that a later
    failure of the same job (a restart on a spare node keeps the job and its restart count) is
    never blamed on an old hang; the verdict itself stays where the user looks for it.
    """
    path = hang_dir(run_dir, job, restart) / run_files.HANG_VERDICT
    taken = path.with_name("verdict.taken")
    if taken.exists():
        return None
    try:
        found = json.loads(path.read_text())
        taken.touch()
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def records(run_dir: str | os.PathLike[str], name: str = FILE) -> list[dict[str, Any]]:
    """Every readable line, in order (a line cut short by a crash is skipped)."""
    try:
        lines = (pathlib.Path(run_dir) / name).read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            log.warning("skipping a damaged line of %s: %r", name, line[:80])
    return found


def history(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One entry per attempt: number, job, restart, nodes, cause, steps gained, excluded nodes."""
    return [
        {
            "attempt": number,
            "job": r.get("job", ""),
            "restart": r.get("restart", 0),
            "nodes": r.get("nodes", []),
            "cause": r.get("cause", ""),
            "steps_gained": max(int(r.get("step", 0)) - int(r.get("from_step", 0)), 0),
            **({"excluded": r["excluded"]} if r.get("excluded") else {}),
            **({"then": r["then"]} if r.get("then") else {}),
            **({"shrank": r["shrank"]} if r.get("shrank") else {}),
        }
        for number, r in enumerate(records(run_dir), start=1)
    ]


@dataclasses.dataclass(frozen=True)
class Recovery:
    """From a failure to the first step after it: wall-clock times (seconds since the epoch)."""

    cause: str
    detected: float  # the hang watchdog's verdict, or the step's end for a death
    gone: float  # every rank of the failed attempt gone (the job script's helper ran)
    started: float | None = None  # the next attempt's processes started
    loaded: float | None = None  # its checkpoint loaded
    first_step: float | None = None  # its first step done

    def as_line(self) -> str:
        """``failed: ...; detected 12:00:01, ranks gone +1.0 s, started +130.2 s, ...``."""
        when = time.strftime("%H:%M:%S", time.localtime(self.detected))
        parts = [f"{self.cause}; detected {when}"]
        for label, value in (
            ("ranks gone", self.gone),
            ("started", self.started),
            ("checkpoint loaded", self.loaded),
            ("first step", self.first_step),
        ):
            parts.append(
                f"{label} " + ("-" if value is None else f"+{value - self.detected:.1f} s")
            )
        return ", ".join(parts)


def last_recovery(run_dir: str | os.PathLike[str]) -> Recovery | None:
    """The last failure and, once the attempt after it has stepped, that attempt's start."""
    failed = [r for r in records(run_dir) if str(r.get("cause", "")).startswith("failed")]
    if not failed:
        return None
    failure = failed[-1]
    gone = float(failure.get("time", 0.0))
    after = [r for r in records(run_dir, STARTS) if float(r.get("time", 0.0)) >= gone]
    start = after[0] if after else {}
    return Recovery(
        cause=str(failure.get("cause", "")),
        detected=float(failure.get("detected", gone)),
        gone=gone,
        **{name: start.get(name) for name in ("started", "loaded", "first_step")},
    )
