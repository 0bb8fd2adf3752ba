"""The ``hpcddp report RUN_DIR|SWEEP_DIR`` command: argparse over `hpcddp.slurm.report`."""

import argparse
import pathlib
from typing import Any

from hpcddp import exit_codes
from hpcddp.slurm import report


def cmd_report(args: argparse.Namespace) -> int:
    """Print what the run (or each run of the sweep) cost, as a table or as JSON."""
    made, why_not = report.reports(pathlib.Path(args.path).expanduser())
    print(report.as_json(made, why_not) if args.json else report.as_text(made, why_not))
    return exit_codes.OK


def add_parser(sub: Any) -> None:
    """``hpcddp report``."""
    parser = sub.add_parser(
        "report",
        help="what a run cost: per attempt nodes, GPUs, wall time, steps gained, time lost, "
        "node- and GPU-hours, useful share; a sweep's runs and totals",
    )
    parser.add_argument("path", help="a run directory (run.dir), or a sweep's directory")
    parser.add_argument("--json", action="store_true", help="the same figures as JSON")
    parser.set_defaults(func=cmd_report)
