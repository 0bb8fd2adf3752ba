"""What a run directory holds: the name of every file a run writes, and ``summary.json``'s one
typed shape, `RunSummary`, which only this module turns into JSON and back.

Layout (``RUN_DIR/``)::

    config.yaml        the resolved configuration (`hpcddp.records.rundir`)
    checkpoints/       step-numbered, complete checkpoints only
    logs/rank-N.log    one log per rank; logs/hang/ the hang watchdog's stacks and verdicts
    metrics.jsonl      one line per logged step and evaluation (`hpcddp.records.metrics_log`)
    summary.json       how the run ended: finished, or failed and why (`RunSummary`)
    attempts.jsonl     every attempt: nodes, why it ended, steps (`hpcddp.records.attempts`)
    starts.jsonl       when each attempt started and first stepped (for `hpcddp report`)
    provenance.json    the code, versions and job that ran (`hpcddp.records.provenance`)
    chain.json         the jobs of a chain (`hpcddp.records.chain_record`)

In the ground floor, stdlib only and torch-free: the trainer writes the summary, and the login
side (``hpcddp status``, chains, sweeps, the submitted task's outcome) reads it, all through
here. A summary written by an older hpcddp reads the same (its fields have not changed names).
"""

import dataclasses
import json
import os
import pathlib
from typing import Any

CONFIG = "config.yaml"
CHECKPOINTS = "checkpoints"
LOGS = "logs"
METRICS = "metrics.jsonl"
METRICS_PNG = "metrics.png"  # `hpcddp plot RUN_DIR`
SUMMARY = "summary.json"
ATTEMPTS = "attempts.jsonl"
STARTS = "starts.jsonl"
PROVENANCE = "provenance.json"
CHAIN = "chain.json"
HANG_VERDICT = "verdict.json"  # in an attempt's folder under logs/hang/
SWEEP_MANIFEST = "sweep.json"  # in a sweep's directory, beside its points' run directories
# NCCL flight-recorder dumps in logs/, one per rank: TORCH_FR_DUMP_TEMP_FILE ends with it and
# torch appends the rank (`hpcddp.comm.flight_recorder`, read by `hpcddp.records.nccl_blame`)
FLIGHT_RECORDER_DUMP = "nccl-trace-rank-"

# summary.json's ``status``
FINISHED = "finished"
FAILED = "failed"  # a run that stopped itself: a non-finite loss


def rank_log_name(rank: int) -> str:
    """``rank-N.log``: everything one rank logged, in ``RUN_DIR/logs/``."""
    return f"rank-{rank}.log"


def rank_log(run_dir: str | os.PathLike[str], rank: int) -> pathlib.Path:
    """``RUN_DIR/logs/rank-N.log``."""
    return pathlib.Path(run_dir) / LOGS / rank_log_name(rank)


def summary_path(run_dir: str | os.PathLike[str]) -> pathlib.Path:
    """``RUN_DIR/summary.json``."""
    return pathlib.Path(run_dir) / SUMMARY


def metrics_path(run_dir: str | os.PathLike[str]) -> pathlib.Path:
    """``RUN_DIR/metrics.jsonl``."""
    return pathlib.Path(run_dir) / METRICS


@dataclasses.dataclass
class RunSummary:
    """Every field of summary.json; the evaluation's metrics are written at the top level.

    A finished run and a run that stopped itself as failed write the same keys; what does not
    apply is null.
    """

    status: str  # FINISHED, or FAILED for a run that stopped itself (non-finite values)
    world_size: int
    hosts: list[str]
    launcher: str
    job_id: str
    steps: int  # optimizer steps taken (where a failed run stopped)
    epochs: int
    final_loss: float
    skipped_steps: int  # non-finite steps skipped (train.nonfinite=skip)
    overflow_steps: int  # fp16 steps GradScaler skipped for an overflow
    reason: str | None = None  # why a failed run stopped: "nonfinite"
    weights_sha256: str | None = None
    first_rank: int | None = None  # the first rank whose own loss was not finite
    latest_checkpoint: int | None = None
    message: str | None = None  # the error every rank raised
    timeline: dict[str, Any] | None = None  # per phase: median, slowest rank and its host
    attempts: list[dict[str, Any]] | None = None  # `hpcddp.records.attempts.history`
    evaluation: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """True for a run that stopped itself as failed (a non-finite loss)."""
        return self.status == FAILED

    def to_json(self) -> str:
        """The file's text: every field, the evaluation's metrics flattened in."""
        record = dataclasses.asdict(self)
        record.update(record.pop("evaluation"))
        return json.dumps(record, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "RunSummary":
        """The summary in ``text``; `DamagedSummary` when it is not one."""
        try:
            record = json.loads(text)
        except ValueError as err:
            raise DamagedSummary(f"not JSON ({err})") from None
        if not isinstance(record, dict):
            raise DamagedSummary("not a JSON object")
        names = {f.name for f in dataclasses.fields(cls)} - {"evaluation"}
        known = {k: v for k, v in record.items() if k in names}
        # every other number is an evaluation metric (``eval_loss``, ``eval_accuracy``, ...)
        metrics = {k: v for k, v in record.items() if k not in names and _is_number(v)}
        return cls(**{**_older_files_lack(), **known}, evaluation=metrics)


def _older_files_lack() -> dict[str, Any]:
    """What a summary written before every field existed is read with. A file with no
    ``status`` was written by a run that finished: `hpcddp status` has always read it so."""
    return {
        "status": FINISHED,
        "world_size": 0,
        "hosts": [],
        "launcher": "",
        "job_id": "",
        "steps": 0,
        "epochs": 0,
        "final_loss": float("nan"),
        "skipped_steps": 0,
        "overflow_steps": 0,
    }


class DamagedSummary(ValueError):
    """A summary.json that cannot be read as a `RunSummary`; its message says why, in words."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_summary(
    run_dir: str | os.PathLike[str], *, since: float | None = None
) -> RunSummary | None:
    """The run's summary; None when there is none, or none written since ``since`` (epoch s,
    less a second of clock slack: a summary older than a job is an earlier run's).

    Raises `DamagedSummary` when the file is there but unreadable.
    """
    path = summary_path(run_dir)
    try:
        if since is not None and path.stat().st_mtime < since - 1:
            return None
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedSummary(f"unreadable ({err})") from None
    return RunSummary.from_json(text)
