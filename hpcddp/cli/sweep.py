"""``hpcddp sweep``: a grid of runs as one job array, ``--retry-failed`` for the points that
failed, and the table ``hpcddp status SWEEP_DIR`` prints (argparse and printing only).

`hpcddp.slurm.grid` reads the grid, `hpcddp.slurm.submission` submits and records the array in
``SWEEP_DIR/sweep.json``, `hpcddp.slurm.sweep_status` makes a row per point.
"""

import argparse
import json
import pathlib
import sys
from typing import Any

from hpcddp import exit_codes
from hpcddp.cli.args import add_cluster_option, add_slurm_options, split_config_and_overrides
from hpcddp.errors import ConfigError
from hpcddp.slurm.grid import parse_grid
from hpcddp.slurm.options import OPTIONS
from hpcddp.slurm.sweep_status import as_table, sweep_rows

USAGE = (
    "hpcddp sweep CONFIG --grid optim.lr=0.001,0.003 [--grid KEY=V1,V2 ...] [key=value ...], "
    "or hpcddp sweep --retry-failed SWEEP_DIR"
)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Submit the grid (or retry a sweep's failed points); print the sweep dir and job id."""
    late = argparse.ArgumentParser(prog="hpcddp sweep")
    _add_options(late)
    late.add_argument("items", nargs="*")
    more = late.parse_intermixed_args(args.items)
    cluster = more.cluster or args.cluster
    retry = more.retry_failed or args.retry_failed
    if retry:
        given = [
            f"--{n.replace('_', '-')}"
            for n in [*OPTIONS, "grid", "max_parallel"]
            if getattr(more, n) is not None or getattr(args, n) is not None
        ]
        if more.items or given:
            extra = " ".join([*given, *more.items])
            raise ConfigError(
                f"--retry-failed takes only the sweep directory (and --cluster), not {extra}: "
                "its points keep their config. HINT: hpcddp sweep --retry-failed SWEEP_DIR"
            )
        return _retry(retry, cluster)
    config_path, overrides = split_config_and_overrides(more.items)
    if config_path is None:
        raise ConfigError(f"no config given. HINT: {USAGE}")
    grid = parse_grid([*(args.grid or []), *(more.grid or [])])
    options = {}
    for name, option in OPTIONS.items():
        value = getattr(more, name) if getattr(more, name) is not None else getattr(args, name)
        if value is not None:
            options[option.field] = value
    from hpcddp.slurm.submission import sweep  # submitit: only when submitting

    parallel = more.max_parallel if more.max_parallel is not None else args.max_parallel
    jobs = sweep(config_path, grid, overrides, max_parallel=parallel, cluster=cluster, **options)
    _announce(jobs, f"submitted a sweep of {len(jobs)} points")
    return exit_codes.OK


def _retry(sweep_dir: str, cluster: str | None) -> int:
    from hpcddp.slurm.submission import retry_failed  # submitit: only when submitting

    jobs = retry_failed(sweep_dir, cluster)
    if not jobs:
        print(f"hpcddp: nothing to retry in {sweep_dir}: no point failed, timed out or stopped")
        return exit_codes.OK
    _announce(jobs, f"resubmitted {len(jobs)} failed point(s)")
    return exit_codes.OK


def _announce(jobs: list[Any], what: str) -> None:
    """The sweep directory and the array's job id on stdout; what to do next on stderr."""
    run_dir = pathlib.Path(jobs[0].paths.folder).parent  # submitit's folder is SWEEP_DIR/submitit
    from submitit.local.local import LocalJob

    job_id = str(jobs[0].job_id).split("_")[0]
    job = f"local-{job_id}" if isinstance(jobs[0], LocalJob) else job_id
    print(run_dir, job, sep="\n", flush=True)
    print(
        f"hpcddp: {what} as job {job} in {run_dir}; follow it with `hpcddp status {run_dir}`",
        file=sys.stderr,
    )


def print_status(sweep_dir: pathlib.Path, as_json: bool) -> int:
    """``hpcddp status SWEEP_DIR``: the table, or with ``--json`` the same rows as a list."""
    rows = sweep_rows(sweep_dir)
    if as_json:
        print(json.dumps([row.as_json() for row in rows], indent=1), flush=True)
    else:
        print(as_table(rows, sweep_dir), flush=True)
    return exit_codes.OK


def _add_options(parser: argparse.ArgumentParser) -> None:
    add_slurm_options(parser)
    parser.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2",
        help="a setting and the values it takes (repeat for more keys; every combination runs)",
    )
    parser.add_argument(
        "--max-parallel",
        type=int,
        metavar="K",
        help="run at most K points at once (Slurm's --array=...%%K)",
    )
    add_cluster_option(parser)
    parser.add_argument(
        "--retry-failed",
        metavar="SWEEP_DIR",
        help="resubmit the failed, timed-out or stopped points of a sweep (they resume)",
    )


def add_parser(subparsers: "argparse._SubParsersAction[Any]") -> None:
    """Register ``sweep`` on the ``hpcddp`` command's subparsers."""
    parser = subparsers.add_parser(
        "sweep", help="submit a grid of runs as one job array, or retry a sweep's failed points"
    )
    _add_options(parser)
    parser.add_argument(
        "items",
        nargs=argparse.REMAINDER,
        metavar="CONFIG [key=value]",
        help="a YAML config and overrides every point shares, such as train.epochs=3",
    )
    parser.set_defaults(func=cmd_sweep)
