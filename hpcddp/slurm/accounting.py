"""Slurm's accounting of a run's jobs (``sacct``), shown beside what the run recorded.

``sacct --duplicates`` lists every run of a job, a requeued job's earlier runs too. Many
clusters run without accounting, where ``sacct`` refuses ("accounting storage is disabled"),
answers nothing or hangs (submitit#1720): then `job_runs` says why in one line, with a short
timeout, and ``hpcddp report`` uses what the run recorded. The client runs through a ``run``
argument (``subprocess.run`` by default) so tests fake Slurm at that edge only.
"""

import dataclasses
import datetime
import os
import re
import subprocess
from collections.abc import Iterable

from hpcddp.records.cost import AttemptCost
from hpcddp.slurm.queue import Runner

FIELDS = ("JobIDRaw", "JobID", "State", "ElapsedRaw", "AllocNodes", "AllocTRES", "Start", "End")
ASK_TIMEOUT_S = 10.0
_GPUS = re.compile(r"gres/gpu=(\d+)")
END_SLACK_S = 30.0  # rank 0's end may be written a little after Slurm's end of the job


@dataclasses.dataclass(frozen=True)
class JobRun:
    """One run of a job as Slurm accounted it."""

    job: str  # the raw job id (an array task's own id)
    name: str  # as Slurm shows it: 123, or 120_3 for an array task
    state: str
    elapsed_s: float
    nodes: int
    gpus: int
    start: float | None
    end: float | None


def job_runs(job_ids: Iterable[str], run: Runner | None = None) -> tuple[list[JobRun], str]:
    """Every run of these jobs, or ``([], why not)`` in one line."""
    ids = sorted({job for job in job_ids if job and job != "local"})
    if not ids:
        return [], "no Slurm job (a local run)"
    command = ["sacct", "-X", "--duplicates", "-n", "-P", "-j", ",".join(ids)]
    command += ["-o", ",".join(FIELDS)]
    env = {**os.environ, "SLURM_TIME_FORMAT": "standard"}  # ISO times
    try:
        done = (run or subprocess.run)(
            command, capture_output=True, text=True, timeout=ASK_TIMEOUT_S, env=env
        )
    except (OSError, subprocess.SubprocessError) as err:
        return [], f"sacct did not answer ({err})"
    said = (done.stderr or done.stdout).strip().splitlines()
    if done.returncode != 0:
        first = said[0].removeprefix("sacct: ") if said else f"exit status {done.returncode}"
        return [], f"sacct: {first}"
    runs = parse(done.stdout)
    return runs, "" if runs else "sacct knows none of the run's jobs"


def parse(text: str) -> list[JobRun]:
    """``sacct -P`` lines in `FIELDS` order."""
    runs = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(FIELDS):
            continue
        raw, name, state, elapsed, nodes, tres, start, end = parts
        gpus = _GPUS.search(tres)
        runs.append(
            JobRun(
                job=raw,
                name=name,
                state=state.split()[0] if state else "",  # "CANCELLED by 1000"
                elapsed_s=float(elapsed or 0),
                nodes=int(nodes or 0),
                gpus=int(gpus[1]) if gpus else 0,
                start=_epoch(start),
                end=_epoch(end),
            )
        )
    return runs


def _epoch(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:  # Unknown, None
        return None


def matching(cost: AttemptCost, runs: list[JobRun]) -> JobRun | None:
    """The run of the attempt's job during which the attempt ended."""
    for found in runs:
        if cost.job not in (found.job, found.name) or found.start is None:
            continue
        end = found.end if found.end is not None else float("inf")
        if found.start <= cost.ended <= end + END_SLACK_S:
            return found
    return None
