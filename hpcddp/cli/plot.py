"""``hpcddp plot RUN_DIR|SWEEP_DIR``: a run's metrics as one PNG, or a sweep's points overlaid
(drawn by `hpcddp.records.charts`; a sweep's points and labels from its ``sweep.json``)."""

import argparse
import pathlib
import sys
from typing import Any

from hpcddp import exit_codes
from hpcddp.records import sweep_manifest
from hpcddp.records.charts import plot_run, plot_sweep

SWEEP_PNG = "sweep.png"


def cmd_plot(args: argparse.Namespace) -> int:
    """Write the PNG and print where it went."""
    target = pathlib.Path(args.run_dir)
    if not sweep_manifest.is_sweep_dir(target):
        print(plot_run(target, args.out), flush=True)
        return exit_codes.OK
    manifest = sweep_manifest.read(target)
    names = sweep_manifest.labels(manifest.points)
    curves = [(names[p.index], pathlib.Path(p.run_dir)) for p in manifest.points]
    out = pathlib.Path(args.out) if args.out else target / SWEEP_PNG
    title = f"sweep {target.resolve().name}: {len(curves)} points"
    written, missing = plot_sweep(curves, out, title)
    if missing:
        print(f"hpcddp: no metrics yet for {', '.join(missing)}", file=sys.stderr)
    print(written, flush=True)
    return exit_codes.OK


def add_parser(subparsers: "argparse._SubParsersAction[Any]") -> None:
    """Register ``plot RUN_DIR|SWEEP_DIR [--out PATH]`` on the command's subparsers."""
    parser = subparsers.add_parser(
        "plot", help="draw a run's metrics.jsonl as a PNG, or a sweep's points overlaid"
    )
    parser.add_argument(
        "run_dir", metavar="RUN_DIR|SWEEP_DIR", help="a run directory (run.dir), or a sweep's"
    )
    parser.add_argument(
        "--out",
        metavar="PATH",
        help=f"the PNG to write (default: RUN_DIR/metrics.png, SWEEP_DIR/{SWEEP_PNG})",
    )
    parser.set_defaults(func=cmd_plot)
