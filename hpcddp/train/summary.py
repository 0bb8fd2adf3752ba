"""The run's summary from where training stands, written at once by rank 0.

The shape and its JSON are `hpcddp.run_files.RunSummary`'s; here it is filled from the rank's
place and `Progress` (which need the trainer's world) and replaced atomically on disk.
"""

import os
from typing import Any

from hpcddp.launch.distenv import DistEnv
from hpcddp.run_files import RunSummary, summary_path
from hpcddp.storage.atomic import atomic_write_text
from hpcddp.train.state import Progress


def summary_of(
    status: str, env: DistEnv, hosts: list[str], progress: Progress, **more: Any
) -> RunSummary:
    """The fields every summary has, from the rank's place and where training stands."""
    return RunSummary(
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


def write_summary(run_dir: str | os.PathLike[str], summary: RunSummary) -> None:
    """Write ``RUN_DIR/summary.json`` at once (rank 0 only): readers see all of it or none."""
    atomic_write_text(summary_path(run_dir), summary.to_json())
