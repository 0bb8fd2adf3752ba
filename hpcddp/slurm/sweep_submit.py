"""`hpcddp.sweep`: a grid of runs submitted as one job array, recorded in ``sweep.json``.

Every point's config is built and checked before anything is submitted; the points run as one
array through the same executor as a single run (`hpcddp.slurm.submission`), each in a run
directory of its own, and the array is recorded in the sweep's manifest
(`hpcddp.records.sweep_manifest`) for ``hpcddp status`` and `hpcddp.slurm.sweep_retry`.
"""

import logging
import os
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hpcddp.config import Config, from_dict, with_values
from hpcddp.errors import ConfigError
from hpcddp.records import sweep_manifest
from hpcddp.slurm import index as job_index
from hpcddp.slurm.grid import point_config, sweep_points
from hpcddp.slurm.submission import (
    LocalRun,
    SlurmRun,
    adopt,
    choose_cluster,
    executor_for,
    job_record,
    resolve_config,
)
from hpcddp.slurm.tasks import TrainTask

log = logging.getLogger(__name__)


def sweep(
    config: Config | str | os.PathLike[str],
    grid: Mapping[str, Sequence[Any]],
    overrides: Sequence[str] = (),
    *,
    max_parallel: int | None = None,
    cluster: str | None = None,
    **slurm_options: Any,
) -> list[SlurmRun | LocalRun]:
    """Submit one job array over the cartesian product of ``grid``; one job per point.

    Each point runs in ``<run.dir>/<index>-<key=value,...>``; ``<run.dir>/sweep.json`` records
    the points and the array (`hpcddp.records.sweep_manifest`), for ``hpcddp status|plot
    SWEEP_DIR`` and `retry_failed`. Every point's config is built and checked here, so a bad
    value fails now, not in the job. ``max_parallel`` caps how many array tasks run at once
    (Slurm only; the local executor starts them all).
    """
    base = resolve_config(config, overrides, slurm_options)
    if base.slurm.chained:
        raise ConfigError(
            f"slurm.chain={base.slurm.chain}: a sweep's points are one job array, which a chain "
            "of singleton jobs cannot be. HINT: set slurm.chain=1 for the sweep, or submit each "
            "point as a run of its own."
        )
    if max_parallel is not None and (not isinstance(max_parallel, int) or max_parallel < 1):
        raise ConfigError(
            f"max_parallel must be a positive integer, got {max_parallel!r}. "
            "HINT: leave it out to run every point at once."
        )
    sweep_dir = pathlib.Path(base.run.dir).absolute()
    if sweep_manifest.is_sweep_dir(sweep_dir):
        raise ConfigError(
            f"{sweep_dir} already holds a sweep ({sweep_manifest.FILE}). HINT: give this sweep "
            f"its own run.dir, or resubmit its failed points with "
            f"`hpcddp sweep --retry-failed {sweep_dir}`."
        )
    base = with_values(base, [(["run", "dir"], str(sweep_dir))])
    points = sweep_points(grid)
    configs = [point_config(base, index, point) for index, point in enumerate(points)]
    manifest = sweep_manifest.Manifest(
        grid={key: list(values) for key, values in grid.items()},
        points=tuple(
            sweep_manifest.Point(index, dict(point), point_dir.run.dir)
            for index, (point, point_dir) in enumerate(zip(points, configs, strict=True))
        ),
        max_parallel=max_parallel,
        config=base.to_dict(),
    )
    sweep_manifest.encode(manifest)  # refuses now what sweep.json could not hold after submitting
    return submit_points(manifest, range(len(points)), cluster)


def submit_points(
    manifest: sweep_manifest.Manifest, indices: Sequence[int], cluster: str | None = None
) -> list[SlurmRun | LocalRun]:
    """Submit the manifest's points ``indices`` as one new job array, and record it there."""
    base = from_dict(manifest.config)
    configs = [_point_again(base, manifest.points[index]) for index in indices]
    cluster = choose_cluster(cluster)
    limit = {"slurm_array_parallelism": manifest.max_parallel} if manifest.max_parallel else {}
    executor = executor_for(base, cluster, **limit)
    submitted_at = time.time()
    with executor.batch():
        delayed = [executor.submit(TrainTask(point)) for point in configs]
    submitted = [adopt(job, executor.folder, cluster) for job in delayed]
    records = [
        job_record(job, point, cluster, submitted_at)
        for job, point in zip(submitted, configs, strict=True)
    ]
    for record in records:
        job_index.write_record(record)
    tasks = tuple(
        sweep_manifest.Task(index, record.name, record.stdout, record.stderr)
        for index, record in zip(indices, records, strict=True)
    )
    array_id = str(submitted[0].job_id).split("_")[0]
    array = sweep_manifest.Array(array_id, cluster, submitted_at, tasks)
    sweep_manifest.write(base.run.dir, manifest.with_array(array))
    log.info("submitted sweep of %d runs (%s) under %s", len(submitted), cluster, base.run.dir)
    return submitted


def _point_again(base: Config, point: sweep_manifest.Point) -> Config:
    """A recorded point's config, rebuilt from the base; it must land in its recorded run dir."""
    config = point_config(base, point.index, tuple(point.grid.items()))
    if config.run.dir != point.run_dir:
        raise ConfigError(
            f"sweep point {point.index} would run in {config.run.dir}, not in its recorded "
            f"{point.run_dir}. HINT: the sweep directory was moved; retry from where it was made."
        )
    return config
