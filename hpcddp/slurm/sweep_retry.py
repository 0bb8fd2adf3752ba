"""Resubmit a sweep's failed, timed-out or stopped points (``hpcddp sweep --retry-failed``).

Which points need it is `hpcddp.slurm.sweep_status`'s judgement; they go back as one new array
over their recorded run directories (`hpcddp.slurm.sweep_submit`), so each resumes from its
latest checkpoint.
"""

import os
import pathlib

from hpcddp.errors import ConfigError
from hpcddp.records import sweep_manifest
from hpcddp.slurm import queue as slurm_queue
from hpcddp.slurm.submission import LocalRun, SlurmRun
from hpcddp.slurm.sweep_status import sweep_rows
from hpcddp.slurm.sweep_submit import submit_points


def retry_failed(
    sweep_dir: str | os.PathLike[str],
    cluster: str | None = None,
    run: slurm_queue.Runner | None = None,
) -> list[SlurmRun | LocalRun]:
    """Resubmit the sweep's failed, timed-out or stopped points as one new array over the same
    run directories (each resumes from its latest checkpoint); [] when none needs it.

    ``cluster`` defaults to where the sweep's last array ran; ``run`` runs ``squeue``.
    """
    sweep_dir = pathlib.Path(sweep_dir)
    manifest = sweep_manifest.read(sweep_dir)
    _refuse_moved(sweep_dir, manifest)
    indices = [row.index for row in sweep_rows(sweep_dir, run) if row.retryable]
    if not indices:
        return []
    return submit_points(manifest, indices, cluster or manifest.arrays[-1].cluster)


def _refuse_moved(sweep_dir: pathlib.Path, manifest: sweep_manifest.Manifest) -> None:
    """A moved sweep directory's manifest still names where it was made, and its points'
    run directories with it: retrying would resume nothing and write where the sweep was."""
    made = pathlib.Path(manifest.config.get("run", {}).get("dir") or sweep_dir)
    if made.exists() and made.samefile(sweep_dir):
        return
    if made.absolute() != sweep_dir.absolute():
        raise ConfigError(
            f"{sweep_dir} was made as {made}: its points' run directories are recorded there. "
            f"HINT: the sweep directory was moved; move it back to {made} to retry it."
        )
