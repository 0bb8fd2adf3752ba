"""The ``hpcddp`` command: small subcommands, each a thin shell over the library.

Errors hpcddp raises on purpose end the command with one line on stderr and a non-zero exit
(2 for bad input, 1 for failures at run time); anything else keeps its traceback.
"""

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from hpcddp import exit_codes
from hpcddp.errors import ConfigError, HpcddpError, HostlistError, LaunchError

USAGE_ERRORS = (ConfigError, LaunchError, HostlistError)


def _split_config_and_overrides(items: Sequence[str], config: str | None) -> tuple[str | None, list]:
    """``[CONFIG] [key=value ...]``: the one item without ``=`` is the config file."""
    overrides = [item for item in items if "=" in item]
    paths = [item for item in items if "=" not in item]
    if len(paths) + (config is not None) > 1:
        raise ConfigError(f"more than one config file given ({', '.join(paths)}). "
                          "HINT: pass one CONFIG and key=value overrides.")
    return (config or (paths[0] if paths else None)), overrides


def cmd_train(args: argparse.Namespace) -> int:
    """Train (or resume) the configured run in this process, or in --nproc local processes."""
    config_path, overrides = _split_config_and_overrides(args.items, args.config)
    from hpcddp.config import load_config
    config = load_config(config_path, overrides)  # fail here, once, before any process starts
    if args.nproc:
        from hpcddp.local_launch import launch
        return launch(["train", *([config_path] if config_path else []), *overrides],
                      args.nproc)
    from hpcddp.trainer import Trainer
    return exit_code(Trainer(config=config).fit())


def exit_code(result: dict) -> int:
    """0 when finished, stopped on request or requeued; distinct codes for the other stops."""
    if result.get("reason") == "interrupted":
        return exit_codes.INTERRUPTED
    if result.get("reason") == "terminated":
        return exit_codes.TERMINATED
    if result.get("reason") == "preempted" and not result.get("requeued"):
        print(f"hpcddp: stopped at step {result['step']} with a checkpoint but the job was not "
              "requeued. HINT: re-run the same command to resume.", file=sys.stderr)
        return exit_codes.STOPPED_NOT_REQUEUED
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    """Print how this process resolves its place in the job (under srun: every task its own)."""
    from dataclasses import asdict

    from hpcddp.environments import resolve_env
    env = resolve_env()
    if args.json:
        print(json.dumps(asdict(env), sort_keys=True), flush=True)
    else:
        fields = " ".join(f"{k}={v}" for k, v in asdict(env).items())
        print(f"hpcddp env: {fields}", flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(prog="hpcddp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train or resume a run from a config")
    train.add_argument("items", nargs="*", metavar="[CONFIG] [key=value]",
                       help="a YAML config and overrides such as optim.lr=0.01")
    train.add_argument("--config", help="the YAML config (same as the positional CONFIG)")
    train.add_argument("--nproc", type=int, default=0,
                       help="start this many local processes (no cluster needed)")
    train.set_defaults(func=cmd_train)

    env = sub.add_parser("env", help="print this process's resolved rank, world and master")
    env.add_argument("--json", action="store_true", help="one JSON object per process")
    env.set_defaults(func=cmd_env)

    from hpcddp import jobs, jobscript, plot
    jobscript.add_parser(sub)
    jobs.add_parsers(sub)  # submit, status, logs
    plot.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hpcddp`` console script and ``python -m hpcddp``."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "items") and all("=" in x and not x.startswith("-") for x in extra):
        args.items += extra  # key=value overrides may follow options
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "nproc", 0) < 0:
        print("hpcddp: error: --nproc must be >= 1 (or left out to train in this process)",
              file=sys.stderr)
        return exit_codes.USAGE
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except USAGE_ERRORS as err:
        print(f"hpcddp: error: {err}", file=sys.stderr)
        return exit_codes.USAGE
    except HpcddpError as err:
        print(f"hpcddp: error: {err}", file=sys.stderr)
        return exit_codes.FAILED
    except KeyboardInterrupt:
        print("hpcddp: interrupted", file=sys.stderr)
        return exit_codes.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
