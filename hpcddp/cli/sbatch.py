"""``hpcddp sbatch``: render the job script for a config and submit it (or print it)."""

import argparse
import sys
from typing import Any

from hpcddp import exit_codes
from hpcddp.cli.args import add_slurm_options, split_config_and_overrides
from hpcddp.config import SlurmConfig, load_config
from hpcddp.errors import ConfigError
from hpcddp.slurm.chain import chained, submit_links
from hpcddp.slurm.cpus_per_task import node_shapes
from hpcddp.slurm.jobscript import JobSpec, render, submit
from hpcddp.slurm.options import OPTIONS, with_options


def cmd_sbatch(args: argparse.Namespace) -> int:
    """Render the job script for a config; print it (--dry-run) or submit it and print the id."""
    config_path, overrides = split_config_and_overrides(args.items)
    if config_path is None:
        raise ConfigError(
            "hpcddp sbatch needs a CONFIG file. "
            "HINT: hpcddp sbatch examples/quickstart.yaml --nodes 2"
        )
    options = {name: getattr(args, name) for name in OPTIONS}
    config = load_config(config_path, overrides)
    script = render(
        JobSpec(config, config_path, overrides, python=args.python, check=args.check),
        options=options,
        node_shapes=node_shapes,  # a GPU job's default CPUs per task come from its nodes
    )
    if args.dry_run:
        print(script, end="")
        return exit_codes.OK
    slurm = with_options(config.slurm, options)
    if slurm.chained and not args.check:
        return _submit_chain(script, config.run.dir, chained(slurm, config.run.dir))
    print(submit(script), flush=True)
    return exit_codes.OK


def _submit_chain(script: str, run_dir: str, slurm: SlurmConfig) -> int:
    """Submit the script as the chain's links, one job id a line (the first link first)."""
    record = submit_links(lambda _: submit(script), run_dir, slurm.job_name, slurm.chain)
    print("\n".join(record.links), flush=True)
    print(
        f"hpcddp: submitted chain {record.name}: {record.size} jobs, one after another; "
        f"{record.follow(run_dir)}",
        file=sys.stderr,
    )
    return exit_codes.OK


def add_parser(subparsers: "argparse._SubParsersAction[Any]") -> None:
    """Register ``hpcddp sbatch`` on the command's subparsers."""
    parser = subparsers.add_parser(
        "sbatch",
        help="submit a config as a Slurm job (or print the job script)",
        description="Render a job script from the config's slurm section, options below "
        "overriding it, and submit it with sbatch. Put options before CONFIG or after all "
        "overrides.",
    )
    parser.add_argument(
        "items",
        nargs="*",
        metavar="CONFIG [key=value]",
        help="a YAML config and overrides such as optim.lr=0.01",
    )
    add_slurm_options(parser)
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the Python the job runs (default: this one, %(default)s)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    parser.add_argument(
        "--check",
        action="store_true",
        help="run the pre-flight (hpcddp check) with these resources instead of training",
    )
    parser.set_defaults(func=cmd_sbatch)
