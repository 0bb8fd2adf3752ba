"""Every attempt of a run across requeues: where it ran, why it ended, how many steps it gained.

``RUN_DIR/attempts.jsonl`` gets one line when an attempt begins (rank 0, once the run directory
is ready) and one when it ends: written by the trainer when it stops or finishes, or by the job
script's retry helper (`hpcddp.slurm.retry`) when a rank died, since a dead rank writes nothing.
`history` folds them into one entry per attempt for the run's summary.

Torch-free, so the job script's helper can read it without importing torch.
"""

import json
import logging
import os
import pathlib
import re
import time
from typing import Any

log = logging.getLogger(__name__)

FILE = "attempts.jsonl"
# The names `hpcddp.storage.checkpoint.CheckpointStore` gives complete checkpoints (the .pt and
# its .sha256 sidecar); a test keeps the two in step.
_CHECKPOINT = re.compile(r"^step-(\d{8,})\.pt$")


def saved_step(run_dir: str | os.PathLike[str]) -> int:
    """The step of the newest complete checkpoint in the run directory (0 when none)."""
    folder = pathlib.Path(run_dir) / "checkpoints"
    try:
        names = set(os.listdir(folder))
    except OSError:
        return 0
    steps = [int(m[1]) for n in names if (m := _CHECKPOINT.match(n)) and f"{n}.sha256" in names]
    return max(steps, default=0)


def _append(run_dir: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """One JSON line, written whole with one write(); a torn last line is skipped on read."""
    line = json.dumps({**record, "time": round(time.time(), 3)}) + "\n"
    with open(pathlib.Path(run_dir) / FILE, "a") as out:
        out.write(line)
        out.flush()
        os.fsync(out.fileno())


def begin(run_dir: str | os.PathLike[str], job: str, restart: int, nodes: list[str]) -> None:
    """Record that an attempt starts on ``nodes``, from the newest saved step."""
    _append(
        run_dir,
        {
            "event": "begin",
            "job": job,
            "restart": restart,
            "nodes": nodes,
            "step": saved_step(run_dir),
        },
    )


def end(
    run_dir: str | os.PathLike[str],
    job: str,
    restart: int,
    cause: str,
    step: int | None = None,
    excluded: list[str] | None = None,
) -> None:
    """Record how an attempt ended: its cause, the step it reached, nodes it asked to avoid."""
    record: dict[str, Any] = {"event": "end", "job": job, "restart": restart, "cause": cause}
    record["step"] = saved_step(run_dir) if step is None else step
    if excluded:
        record["excluded"] = excluded
    _append(run_dir, record)


def records(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every readable line, in order (a line cut short by a crash is skipped)."""
    try:
        lines = (pathlib.Path(run_dir) / FILE).read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            log.warning("skipping a damaged line of %s: %r", FILE, line[:80])
    return found


def history(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One entry per attempt: number, job, nodes, cause, steps gained (and excluded nodes)."""
    attempts: list[dict[str, Any]] = []
    for record in records(run_dir):
        if record.get("event") == "begin":
            attempts.append(
                {
                    "attempt": len(attempts) + 1,
                    "job": record.get("job", ""),
                    "restart": record.get("restart", 0),
                    "nodes": record.get("nodes", []),
                    "from_step": record.get("step", 0),
                    "cause": "ended without a record (node lost?)",
                    "steps_gained": 0,
                }
            )
        elif record.get("event") == "end" and attempts:
            current = attempts[-1]
            current["cause"] = record.get("cause", "")
            current["steps_gained"] = max(record.get("step", 0) - current["from_step"], 0)
            if record.get("excluded"):
                current["excluded"] = record["excluded"]
    return attempts


def as_lines(attempts: list[dict[str, Any]]) -> list[str]:
    """``attempt 2 (job 17, restart 1) on n1,n3: finished, +120 steps`` for each attempt."""
    lines = []
    for a in attempts:
        avoided = f", then excluded {','.join(a['excluded'])}" if a.get("excluded") else ""
        lines.append(
            f"attempt {a['attempt']} (job {a['job'] or '-'}, restart {a['restart']}) on "
            f"{','.join(a['nodes'])}: {a['cause']}, +{a['steps_gained']} steps{avoided}"
        )
    return lines
