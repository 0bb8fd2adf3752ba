"""The ``hpcddp submit``, ``status`` and ``logs`` commands: argparse over `hpcddp.slurm`.

`hpcddp.slurm.submission` starts jobs, `hpcddp.slurm.index` remembers them,
`hpcddp.slurm.queue` asks Slurm about them and `hpcddp.slurm.status` turns both into a state
and a list of output files; this module only parses the command line and prints.
"""

import argparse
import pathlib
import sys
from typing import Any

from hpcddp import exit_codes
from hpcddp.cli import sweep
from hpcddp.cli.args import add_cluster_option, add_slurm_options, split_config_and_overrides
from hpcddp.errors import ConfigError
from hpcddp.records import chain_record, sweep_manifest
from hpcddp.records.runinfo import run_lines
from hpcddp.run_files import metrics_path
from hpcddp.slurm import index as job_index
from hpcddp.slurm.chain_status import chain_lines
from hpcddp.slurm.options import OPTIONS
from hpcddp.slurm.status import job_status, log_paths


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit the configured run and print its job id (does not wait)."""
    from hpcddp.slurm.submission import submit  # submitit: only when submitting

    # argparse stops reading options at the first positional; read the rest here, so options
    # may follow CONFIG: `hpcddp submit CONFIG --nodes 2 optim.lr=0.1`.
    late = argparse.ArgumentParser(prog="hpcddp submit")
    _add_submit_options(late)
    late.add_argument("items", nargs="*")
    more = late.parse_intermixed_args(args.items)
    config_path, overrides = split_config_and_overrides(more.items)
    if config_path is None:
        raise ConfigError(
            "no config given. HINT: hpcddp submit examples/quickstart.yaml "
            "[--nodes N ...] [key=value ...]"
        )
    options = {}
    for name, option in OPTIONS.items():
        value = getattr(more, name) if getattr(more, name) is not None else getattr(args, name)
        if value is not None:
            options[option.field] = value
    check = more.check or args.check
    job = submit(
        config_path, overrides, cluster=more.cluster or args.cluster, check=check, **options
    )
    job_name = f"local-{job.job_id}" if _is_local(job) else job.job_id
    print(job_name, flush=True)
    print(
        f"hpcddp: submitted job {job_name}; follow it with `hpcddp status {job_name}` and "
        f"`hpcddp logs {job_name}`",
        file=sys.stderr,
    )
    _announce_chain(job.job_id)
    return exit_codes.OK


def _announce_chain(first: str) -> None:
    """For a chain (its first link's id printed), the links and how to cancel them all, as
    ``hpcddp sbatch`` says them."""
    for found in job_index.find_records(first):
        record = chain_record.load(found.run_dir)
        if record is not None and record.links[:1] == (first,):
            print(
                f"hpcddp: job {first} is link 1 of chain {record.name}: jobs "
                f"{','.join(record.links)}, one after another; {record.follow(found.run_dir)}",
                file=sys.stderr,
            )


def _add_submit_options(parser: argparse.ArgumentParser) -> None:
    add_slurm_options(parser)
    add_cluster_option(parser)
    parser.add_argument(
        "--check",
        action="store_true",
        help="submit the pre-flight (hpcddp check) with these resources instead of training",
    )


def _is_local(job: object) -> bool:
    from submitit.local.local import LocalJob

    return isinstance(job, LocalJob)


def cmd_status(args: argparse.Namespace) -> int:
    """A job's state, nodes, pending reason and run directory; a run directory's latest figures."""
    target = pathlib.Path(args.job_id)
    if sweep_manifest.is_sweep_dir(target):
        return sweep.print_status(target, args.json)
    if args.json:
        raise ConfigError(
            f"--json is for a sweep directory; {args.job_id} is not one. "
            f"HINT: hpcddp status {args.job_id} (without --json)."
        )
    if target.is_dir():
        print("\n".join([*run_lines(target), *chain_lines(target)]), flush=True)
        return exit_codes.OK
    if "/" in args.job_id:
        raise ConfigError(
            f"{args.job_id}: no such directory. "
            "HINT: pass a run directory, a sweep directory or a job id."
        )
    blocks = []
    for status in job_status(args.job_id):
        lines = status.lines()
        run_dir = pathlib.Path(status.run_dir) if status.run_dir else None
        if run_dir is not None and metrics_path(run_dir).exists():
            lines += run_lines(run_dir)[1:]  # the figures, without the run dir again
        if run_dir is not None:
            lines += chain_lines(run_dir)
        blocks.append("\n".join(lines))
    print("\n\n".join(blocks), flush=True)
    return exit_codes.OK


def cmd_logs(args: argparse.Namespace) -> int:
    """Print the job's output files, or one rank's log with --rank."""
    if args.rank is not None and args.rank < 0:
        raise ConfigError(f"--rank must be >= 0, got {args.rank}.")
    paths = log_paths(args.job_id, args.rank)
    existing = [p for p in paths if p.exists()]
    if not existing:
        print(
            f"hpcddp: job {args.job_id} has no output yet ({', '.join(map(str, paths))} "
            "missing). HINT: `hpcddp status "
            f"{args.job_id}` says whether it started.",
            file=sys.stderr,
        )
        return exit_codes.FAILED
    for path in existing:
        if len(existing) > 1:
            print(f"==> {path} <==", flush=True)
        sys.stdout.write(path.read_text(errors="replace"))
    sys.stdout.flush()
    return exit_codes.OK


def add_parsers(subparsers: "argparse._SubParsersAction[Any]") -> None:
    """Register ``submit``, ``status`` and ``logs`` on the ``hpcddp`` command's subparsers."""
    submit = subparsers.add_parser(
        "submit",
        help="submit a run to Slurm (or run it locally) and print the job id without waiting",
    )
    _add_submit_options(submit)
    submit.add_argument(
        "items",
        nargs=argparse.REMAINDER,
        metavar="CONFIG [key=value]",
        help="a YAML config and overrides such as optim.lr=0.01",
    )
    submit.set_defaults(func=cmd_submit)

    status = subparsers.add_parser(
        "status",
        help="state and figures of a submitted job or a run directory; a sweep's table",
    )
    status.add_argument("job_id", metavar="JOBID|RUN_DIR|SWEEP_DIR")
    status.add_argument(
        "--json", action="store_true", help="a sweep's rows as a JSON list (SWEEP_DIR only)"
    )
    status.set_defaults(func=cmd_status)

    logs = subparsers.add_parser("logs", help="print a submitted job's output, or one rank's log")
    logs.add_argument("job_id", metavar="JOBID")
    logs.add_argument(
        "--rank",
        type=int,
        default=None,
        help="print <run.dir>/logs/rank-R.log instead of the job's output",
    )
    logs.set_defaults(func=cmd_logs)
