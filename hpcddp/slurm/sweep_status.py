"""Where every point of a sweep stands: one row per point, for ``hpcddp status SWEEP_DIR``.

Read from the sweep directory alone: its manifest (`hpcddp.records.sweep_manifest`) names each
point's latest job, one ``squeue`` call asks Slurm about all of them at once (hundreds of array
tasks cost one call, not hundreds), and each run directory's files say the rest: the step and
eval metrics (``metrics.jsonl``), whether it finished (``summary.json``, never trusted when
older than the job), and why it failed (srun's own line in the job's output, or the error the
task raised). One task that timed out or died is one failed row, never a broken collection
(submitit#1628).
"""

import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Any

from hpcddp.records import attempts, sweep_manifest
from hpcddp.records.runinfo import jsonl_records
from hpcddp.resilience.rules import Failure
from hpcddp.run_files import metrics_path
from hpcddp.slurm.index import JobRecord
from hpcddp.slurm.queue import ACTIVE_STATES, Runner, query_states
from hpcddp.slurm.status import file_outcome, final_state, local_alive, read_result

PENDING = frozenset({"PENDING", "CONFIGURING"})
# Slurm states of a job that was stopped and will run again without anyone's help.
COMING_BACK = frozenset({"PREEMPTED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})
# Slurm end states that say why by themselves.
SLURM_REASONS = {
    "TIMEOUT": "time limit reached (TIMEOUT)",
    "CANCELLED": "cancelled (CANCELLED)",
    "NODE_FAIL": "a node failed (NODE_FAIL)",
    "OUT_OF_MEMORY": "out of memory (OUT_OF_MEMORY)",
    "DEADLINE": "deadline reached (DEADLINE)",
    "BOOT_FAIL": "a node failed to boot (BOOT_FAIL)",
}
# Eval metrics whose best value is the highest; every other one is best when lowest.
HIGHER_IS_BETTER = ("acc", "f1", "auc", "precision", "recall", "bleu", "score")
OUTPUT_TAIL_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class PointRow:
    """One point's row: where it stands, how far it got, its eval metrics, its attempts."""

    index: int
    grid: dict[str, Any]
    state: str  # pending, running, preempted, completed, failed (or unsubmitted)
    reason: str  # why it failed or stopped; "" otherwise
    step: int | None
    final: dict[str, float]  # the last eval's metrics
    best: dict[str, float]  # each eval metric's best value over the run
    attempts: int
    job: str
    run_dir: str
    ended: bool  # no job of this point will run again by itself

    @property
    def retryable(self) -> bool:
        """Failed, timed out, or stopped before its end with nothing left to resume it."""
        return self.ended and self.state in ("failed", "preempted")

    def as_json(self) -> dict[str, Any]:
        """The row for scripts: ``index, grid, state, reason, step, metrics, attempts, ...``."""
        return {
            "index": self.index,
            "grid": self.grid,
            "state": self.state,
            "reason": self.reason,
            "step": self.step,
            "metrics": {"final": self.final, "best": self.best},
            "attempts": self.attempts,
            "job": self.job,
            "run_dir": self.run_dir,
        }


# -- the state of one job ---------------------------------------------------------------------


def point_state(slurm_state: str | None, outcome: str | None) -> tuple[str, str, bool]:
    """(state, reason, ended) from Slurm's state (None: not asked) and the run's files.

    Slurm's active states stand while the job may still run; once it ended, the files decide
    as `hpcddp.slurm.status.final_state` does: never completed without a fresh summary.json.
    """
    if slurm_state in PENDING:
        return "pending", "", False
    if slurm_state in COMING_BACK:
        return "preempted", f"requeued ({slurm_state})", False
    if slurm_state in ACTIVE_STATES:
        return "running", "", False
    text = final_state(slurm_state, outcome)
    word, _, detail = text.partition(" ")
    if word == "COMPLETED":
        return "completed", "", True
    if word == "STOPPED":
        return "preempted", "stopped before its end", True
    return "failed", SLURM_REASONS.get(word, detail.strip("()")), True


def failure_reason(record: JobRecord, reason: str) -> str:
    """The one-line reason a failed job gives best: srun's line naming the task and node that
    died first, the error the task raised, or what Slurm and the files said (``reason``)."""
    if reason and not reason.startswith(("the scheduler", "Slurm says")):
        return reason  # the summary's reason, or a Slurm end state that speaks for itself
    died = _srun_death(pathlib.Path(record.stderr))
    if died:
        return died
    raised = read_result(record.result_pickle())
    if raised is not None and raised[0] == "error":
        lines = [line for line in str(raised[1]).splitlines() if line.strip()]
        return lines[-1].strip() if lines else "the task raised an error"
    return reason or "the job failed"


def _srun_death(stderr: pathlib.Path) -> str:
    """``task 1 on c2n1: Killed`` from srun's ``srun: error: HOST: task N: ...`` lines: the
    task that died first ended the others (``--kill-on-bad-exit``), so its line is the cause
    (`Failure.from_srun` chooses it)."""
    try:
        with stderr.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(size - OUTPUT_TAIL_BYTES, 0))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return ""
    failure = Failure.from_srun(1, tail)
    return failure.what if failure.node else ""


# -- figures from the run directory ------------------------------------------------------------


def eval_figures(records: Sequence[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """(the last eval's metrics, each metric's best value) from metrics.jsonl records."""
    evals = [r for r in records if any(k.startswith("eval_") for k in r)]
    final = {k: v for k, v in (evals[-1] if evals else {}).items() if _is_metric(k, v)}
    best: dict[str, float] = {}
    for record in evals:
        for key, value in record.items():
            if _is_metric(key, value) and (key not in best or _better(key, value, best[key])):
                best[key] = value
    return final, best


def _is_metric(key: str, value: Any) -> bool:
    return key.startswith("eval_") and isinstance(value, (int, float)) and value == value


def _better(key: str, value: float, than: float) -> bool:
    higher = any(word in key for word in HIGHER_IS_BETTER)
    return value > than if higher else value < than


def _run_figures(run_dir: str) -> tuple[int | None, dict[str, float], dict[str, float]]:
    """(the latest step, final eval metrics, best eval metrics) of one run directory."""
    path = metrics_path(run_dir)
    records = jsonl_records(path)[0] if path.exists() else []
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    return (max(steps) if steps else None), *eval_figures(records)


# -- the rows ---------------------------------------------------------------------------------


def _record(
    sweep_dir: pathlib.Path,
    array: sweep_manifest.Array,
    task: sweep_manifest.Task,
    point: sweep_manifest.Point,
) -> JobRecord:
    """The job index's record of one task, rebuilt from the manifest alone."""
    return JobRecord(
        job_id=task.job.removeprefix("local-"),
        cluster=array.cluster,
        run_dir=point.run_dir,
        submitit_folder=str(sweep_dir / "submitit"),
        stdout=task.stdout,
        stderr=task.stderr,
        num_tasks=0,  # not needed to tell where a job stands
        submitted_at=array.submitted_at,
    )


def sweep_rows(sweep_dir: str | pathlib.Path, run: Runner | None = None) -> list[PointRow]:
    """One row per point of the sweep in ``sweep_dir``, from its latest job."""
    sweep_dir = pathlib.Path(sweep_dir).absolute()
    manifest = sweep_manifest.read(sweep_dir)
    latest = {p.index: manifest.latest(p.index) for p in manifest.points}
    slurm_jobs = [t.job for a, t in filter(None, latest.values()) if a.cluster == "slurm"]
    queue = query_states(slurm_jobs, run)
    rows = []
    for point in manifest.points:
        found = latest[point.index]
        if found is None:  # only in a manifest made by hand: submission records its array
            rows.append(_row(point, ("unsubmitted", "", False), "", 0))
            continue
        array, task = found
        state = _job_state(_record(sweep_dir, array, task, point), queue)
        rows.append(_row(point, state, task.job, manifest.submissions(point.index)))
    return rows


def _job_state(record: JobRecord, queue: dict[str, dict[str, str]]) -> tuple[str, str, bool]:
    """(state, reason, ended) of one task: Slurm's state (or the local controller's), the files."""
    outcome = file_outcome(record)
    if record.cluster == "local":
        slurm_state = "RUNNING" if local_alive(record.job_id) else None
    elif not queue:  # squeue did not answer: say so, unless the files already know the end
        if outcome is None:
            return "unknown", "Slurm did not answer squeue; try again", False
        slurm_state = None
    else:
        slurm_state = queue.get(record.job_id, {}).get("State")
    state, reason, ended = point_state(slurm_state, outcome)
    return state, failure_reason(record, reason) if state == "failed" else reason, ended


def _row(
    point: sweep_manifest.Point, state: tuple[str, str, bool], job: str, submitted: int
) -> PointRow:
    step, final, best = _run_figures(point.run_dir)
    recorded = len(attempts.records(point.run_dir))  # requeues within a job count too
    return PointRow(
        index=point.index,
        grid=point.grid,
        state=state[0],
        reason=state[1],
        step=step,
        final=final,
        best=best,
        attempts=max(submitted, recorded),
        job=job,
        run_dir=point.run_dir,
        ended=state[2],
    )


# -- the table --------------------------------------------------------------------------------


def as_table(rows: Sequence[PointRow], sweep_dir: str | pathlib.Path) -> str:
    """The rows as aligned text, each eval metric as ``final (best)``, then a count by state."""
    keys = list(dict.fromkeys(k for row in rows for k in row.grid))
    metrics = sorted({k for row in rows for k in row.final}, key=lambda k: (k != "eval_loss", k))
    header = ["index", *keys, "state", "step", *(f"{m} (best)" for m in metrics), "attempts"]
    header.append("reason")
    lines = [header]
    for row in rows:
        figures = [_final_best(row, metric) for metric in metrics]
        grid = [_text(row.grid.get(key, "")) for key in keys]
        step = "-" if row.step is None else str(row.step)
        lines.append([str(row.index), *grid, row.state, step, *figures, str(row.attempts)])
        lines[-1].append(row.reason or "")
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    ]
    return "\n".join([*text, "", _counts(rows, sweep_dir)])


def _final_best(row: PointRow, metric: str) -> str:
    if metric not in row.final:
        return "-"
    return f"{row.final[metric]:.4g} ({row.best.get(metric, row.final[metric]):.4g})"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _counts(rows: Sequence[PointRow], sweep_dir: str | pathlib.Path) -> str:
    """``4 points: 2 completed, 2 failed`` and, when some can be retried, how."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.state] = counts.get(row.state, 0) + 1
    line = f"{len(rows)} points: " + ", ".join(f"{n} {state}" for state, n in counts.items())
    retry = sum(row.retryable for row in rows)
    if retry:
        line += f"; resubmit the {retry} failed with `hpcddp sweep --retry-failed {sweep_dir}`"
    return line
