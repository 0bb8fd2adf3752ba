"""``hpcddp checkpoint inspect RUN_DIR`` and ``hpcddp checkpoint export RUN_DIR --to FILE``:
what a run's checkpoints are, and its model's whole weights for inference
(`hpcddp.storage.checkpoint_tools`, imported when used: it needs torch)."""

import argparse
from typing import Any

from hpcddp import exit_codes


def cmd_inspect(args: argparse.Namespace) -> int:
    from hpcddp.storage.checkpoint_tools import inventory

    found = inventory(args.run_dir, verify=args.verify)
    print(f"{'step':>8}  {'kind':7}  {'ranks':>5}  {'strategy':8}  {'MB':>9}  state")
    for f in found:
        ranks = str(f.world_size) if f.world_size is not None else "-"
        state = ("complete" if f.complete else "TORN") + (f", {f.integrity}" if f.integrity else "")
        print(
            f"{f.step:>8}  {f.kind:7}  {ranks:>5}  {f.strategy or '-':8}  "
            f"{f.size_bytes / 1e6:>9.1f}  {state}"
        )
    if not found:
        print("no checkpoints")
    return exit_codes.OK


def cmd_export(args: argparse.Namespace) -> int:
    from hpcddp.storage.checkpoint_tools import export

    newest, tensors = export(args.run_dir, args.to)
    print(f"{args.to}: {tensors} tensors of step {newest.step} ({newest.path.name})", flush=True)
    return exit_codes.OK


def add_parser(subparsers: "argparse._SubParsersAction[Any]") -> None:
    """Register ``checkpoint inspect`` and ``checkpoint export``."""
    parser = subparsers.add_parser("checkpoint", help="list a run's checkpoints, or export one")
    verbs = parser.add_subparsers(dest="verb", required=True)
    inspect = verbs.add_parser(
        "inspect", help="each checkpoint's step, kind, ranks, strategy, size and state"
    )
    inspect.add_argument("run_dir", metavar="RUN_DIR")
    inspect.add_argument(
        "--verify", action="store_true", help="read every checkpoint's files against their digests"
    )
    inspect.set_defaults(func=cmd_inspect)
    export = verbs.add_parser(
        "export", help="the newest complete checkpoint's model weights, whole, as safetensors"
    )
    export.add_argument("run_dir", metavar="RUN_DIR")
    export.add_argument("--to", required=True, metavar="FILE", help="e.g. model.safetensors")
    export.set_defaults(func=cmd_export)
