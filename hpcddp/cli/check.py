"""``hpcddp check``: the pre-flight, started the same ways as training.

``srun hpcddp check CONFIG`` in an allocation, ``hpcddp check CONFIG --nproc N`` here,
``sbatch sbatch/train.sh --check CONFIG``, ``hpcddp sbatch CONFIG --check`` or
``hpcddp submit CONFIG --check`` on a cluster. Rank 0 prints one table and a line per problem;
the exit status is 1 when the job would not train.
"""

import argparse
import os
from typing import Any

from hpcddp import exit_codes
from hpcddp.cli.args import split_config_and_overrides
from hpcddp.config import load_config
from hpcddp.errors import ConfigError, HpcddpError, agreed


def cmd_check(args: argparse.Namespace) -> int:
    """Run the pre-flight in this process (one rank of a job), or in --nproc local processes."""
    config_path, overrides = split_config_and_overrides(args.items, args.config)
    config = load_config(config_path, overrides)  # fail here, once, before any rank starts
    if args.size_mb <= 0:
        raise ConfigError(f"--size-mb must be > 0, got {args.size_mb}. HINT: e.g. --size-mb 16")
    if args.nproc is not None:
        if args.nproc < 1:
            raise ConfigError(f"--nproc must be >= 1, got {args.nproc}. HINT: e.g. --nproc 2")
        from hpcddp.launch.local import launch

        argv = ["check", *([config_path] if config_path else []), *overrides]
        return launch([*argv, "--size-mb", str(args.size_mb)], args.nproc)
    from hpcddp.check.preflight import check
    from hpcddp.check.table import as_text
    from hpcddp.launch.local import watch_launcher

    watch_launcher(os.environ)
    from hpcddp.train.model_size import measure

    outcome = check(config, args.size_mb, measure_model=lambda: measure(config))
    if outcome.report is not None:
        print(as_text(outcome.report, outcome.problems), flush=True)
    if outcome.errors:  # rank 0 prints it; the others wait a moment (`hpcddp.cli.main.report`)
        raise agreed(
            HpcddpError(
                f"hpcddp check found {outcome.errors} error(s): this job would not train. "
                "HINT: fix the errors listed above, then run hpcddp check again."
            )
        )
    return exit_codes.OK


def add_parser(subparsers: "argparse._SubParsersAction[Any]") -> None:
    """Register ``hpcddp check`` on the command's subparsers."""
    parser = subparsers.add_parser(
        "check",
        help="pre-flight: every rank's host, CPUs, GPUs, network and versions; timed "
        "all-reduce and node pairs; what would stop training",
    )
    parser.add_argument(
        "items",
        nargs="*",
        metavar="[CONFIG] [key=value]",
        help="the run's YAML config and overrides (run.dir, data.num_workers, dist.* matter)",
    )
    parser.add_argument("--config", help="the YAML config (same as the positional CONFIG)")
    parser.add_argument("--nproc", type=int, help="start this many local processes")
    parser.add_argument(
        "--size-mb",
        type=float,
        default=16.0,
        help="all-reduce size for the bandwidth figure (default: %(default)s)",
    )
    parser.set_defaults(func=cmd_check)
