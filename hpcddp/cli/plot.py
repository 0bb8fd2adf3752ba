"""``hpcddp plot RUN_DIR``: a run's metrics as one PNG (drawn by `hpcddp.storage.charts`)."""

import argparse
from typing import Any

from hpcddp import exit_codes
from hpcddp.storage.charts import plot_run


def cmd_plot(args: argparse.Namespace) -> int:
    """Write the PNG and print where it went."""
    print(plot_run(args.run_dir, args.out), flush=True)
    return exit_codes.OK


def add_parser(subparsers: "argparse._SubParsersAction[Any]") -> None:
    """Register ``plot RUN_DIR [--out PATH]`` on the command's subparsers."""
    parser = subparsers.add_parser("plot", help="draw a run's metrics.jsonl as a PNG")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (run.dir)")
    parser.add_argument(
        "--out", metavar="PATH", help="the PNG to write (default: RUN_DIR/metrics.png)"
    )
    parser.set_defaults(func=cmd_plot)
