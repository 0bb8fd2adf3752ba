"""Every attempt of a run across requeues: where it ran, why it ended, how many steps it gained.

``RUN_DIR/attempts.jsonl`` gets one line per attempt, once it ended: written by rank 0 when the
run stops or finishes, or by the job script's policy helper (`hpcddp.slurm.policy`) when a rank
died, since a dead rank writes nothing. `history` lists them for the run's summary.

Torch-free, so the job script's helper can read it without importing torch.
"""

import json
import logging
import os
import pathlib
import time
from typing import Any

from hpcddp.storage.checkpoint_names import CHECKPOINT_NAME, SIDECAR_SUFFIX

log = logging.getLogger(__name__)

FILE = "attempts.jsonl"


def saved_step(run_dir: str | os.PathLike[str]) -> int:
    """The step of the newest complete checkpoint in the run directory (0 when none)."""
    folder = pathlib.Path(run_dir) / "checkpoints"
    try:
        names = set(os.listdir(folder))
    except OSError:
        return 0
    complete = [m for n in names if (m := CHECKPOINT_NAME.match(n)) and n + SIDECAR_SUFFIX in names]
    steps = [int(m[1]) for m in complete]
    return max(steps, default=0)


def _append(run_dir: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """One JSON line, written whole with one write(); a torn last line is skipped on read, and
    the next line starts on a line of its own."""
    line = json.dumps({**record, "time": round(time.time(), 3)}) + "\n"
    with open(pathlib.Path(run_dir) / FILE, "a+b") as out:
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


def record(
    run_dir: str | os.PathLike[str],
    *,
    job: str,
    restart: int,
    nodes: list[str],
    cause: str,
    step: int | None = None,
    from_step: int | None = None,
    excluded: list[str] | None = None,
    then: str | None = None,
) -> None:
    """Record one attempt once it ended: where it ran, why it ended, the steps it spanned.

    ``step`` defaults to the newest saved checkpoint (what the next attempt resumes from),
    ``from_step`` to where the previous attempt ended. ``then`` is what the job did next
    after a failure: ``restart`` (in the same job, on a spare node), ``requeue`` or ``stop``.
    """
    entry: dict[str, Any] = {"job": job, "restart": restart, "nodes": nodes, "cause": cause}
    entry["from_step"] = last_step(run_dir) if from_step is None else from_step
    entry["step"] = saved_step(run_dir) if step is None else step
    if excluded:
        entry["excluded"] = excluded
    if then:
        entry["then"] = then
    _append(run_dir, entry)


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
        }
        for number, r in enumerate(records(run_dir), start=1)
    ]
