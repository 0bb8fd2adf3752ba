"""``summary.json``: how a run ended, in one shape, written by one function on rank 0.

A finished run and a run that stopped itself as failed (a non-finite loss) write the same keys;
what does not apply is null. ``hpcddp status`` and ``hpcddp info`` read ``status`` and
``reason``; tests and users read the figures.
"""

import dataclasses
import json
import pathlib
from typing import Any

from hpcddp.launch.distenv import DistEnv
from hpcddp.storage.atomic import atomic_write_text
from hpcddp.train.state import Progress

FILE = "summary.json"


@dataclasses.dataclass
class RunSummary:
    """Every field of summary.json; the evaluation's metrics are written at the top level."""

    status: str  # "finished", or "failed" for a run that stopped itself (non-finite values)
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
    timeline: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] | None = None
    evaluation: dict[str, float] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, status: str, env: DistEnv, hosts: list[str], progress: Progress, **more: Any):
        """The fields every summary has, from the rank's place and where training stands."""
        return cls(
            status=status,
            world_size=env.world_size,
            hosts=list(hosts),
            launcher=env.launcher,
            job_id=env.job_id,
            steps=progress.step,
            epochs=progress.epoch + (progress.batch > 0),
            final_loss=progress.last_loss,
            skipped_steps=progress.skipped_steps,
            overflow_steps=progress.overflow_steps,
            **more,
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON object: every field, the evaluation's metrics flattened in."""
        record = dataclasses.asdict(self)
        record.update(record.pop("evaluation"))
        return record


def write_summary(run_dir: pathlib.Path, summary: RunSummary) -> dict[str, Any]:
    """Write ``RUN_DIR/summary.json`` at once (rank 0 only); the object written."""
    record = summary.as_dict()
    atomic_write_text(pathlib.Path(run_dir) / FILE, json.dumps(record, indent=2) + "\n")
    return record
