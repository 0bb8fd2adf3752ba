"""``hpcddp train`` and ``hpcddp env``: run a config here or in N local processes; a rank's view.

The rank side (torch) is imported inside the commands that need it, so ``hpcddp --help`` and
the Slurm subcommands stay light.
"""

import argparse
import contextlib
import json
import os
import pathlib
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from hpcddp import exit_codes
from hpcddp.cli.args import split_config_and_overrides
from hpcddp.config import load_config, reference
from hpcddp.config.loading import read_text
from hpcddp.errors import ConfigError, agreed
from hpcddp.launch import collector
from hpcddp.outcome import RunOutcome, StopReason


def cmd_train(args: argparse.Namespace) -> int:
    """Train (or resume) the configured run in this process, or in --nproc local processes."""
    if args.help_config:
        print(reference.as_text(), end="", flush=True)
        return exit_codes.OK
    config_path, overrides = split_config_and_overrides(args.items, args.config)
    if args.nproc is not None:
        if args.nproc < 1:
            raise ConfigError(
                f"--nproc must be >= 1, got {args.nproc}. "
                "HINT: leave it out to train in this process."
            )
        from hpcddp.launch.local import launch

        with _readable_by_children(config_path) as shared:
            load_config(shared, overrides)  # fail here, once, before any process starts
            return launch(
                ["train", *([f"--config={shared}"] if shared else []), *overrides], args.nproc
            )
    try:  # bad input is refused before torch loads
        config = load_config(config_path, overrides)
    except ConfigError as err:
        # every rank reads the same file and overrides: rank 0 says it, once, before the others
        # leave (`hpcddp.cli.main.report`), even when srun ends rank 0 as soon as one has left
        raise agreed(err) from None
    with collector.paused():  # until the first step: torch's import makes no garbage worth a pass
        from hpcddp.launch.local import watch_launcher
        from hpcddp.train.trainer import Trainer

        watch_launcher(os.environ)  # under --nproc: end with the launcher, even a killed one
        return exit_code(Trainer(config=config).fit())


@contextlib.contextmanager
def _readable_by_children(path: str | None) -> Iterator[str | None]:
    """The config as a file every rank can open: ``/dev/fd/N`` or a pipe is read once, here."""
    if path is None or pathlib.Path(path).is_file():
        yield path
        return
    text = read_text(pathlib.Path(path))
    with tempfile.TemporaryDirectory(prefix="hpcddp-config-") as folder:
        copy = pathlib.Path(folder) / "piped-config.yaml"  # not a run directory's config.yaml
        copy.write_text(text)
        yield str(copy)


def exit_code(outcome: RunOutcome) -> int:
    """0 when finished, stopped on request, requeued or handed on to the chain's next link;
    distinct codes for the other stops."""
    if outcome.stop == StopReason.INTERRUPTED:
        return exit_codes.INTERRUPTED
    if outcome.stop == StopReason.TERMINATED:
        return exit_codes.TERMINATED
    if outcome.stop == StopReason.PREEMPTED and not (outcome.requeued or outcome.handed_on):
        print(
            f"hpcddp: stopped at step {outcome.step} with a checkpoint but the job was not "
            "requeued. HINT: re-run the same command to resume.",
            file=sys.stderr,
        )
        return exit_codes.STOPPED_NOT_REQUEUED
    return exit_codes.OK


def cmd_env(args: argparse.Namespace) -> int:
    """Print how this process resolves its place in the job (under srun: every task its own)."""
    from hpcddp.launch.resolve import resolve_env

    env = resolve_env().facts()
    if args.json:
        print(json.dumps(env, sort_keys=True), flush=True)
    else:
        env["gpus"] = ",".join(g["uuid"] or str(g["index"]) for g in env["gpus"]) or "-"
        print(f"hpcddp env: {' '.join(f'{k}={v}' for k, v in env.items())}", flush=True)
    return exit_codes.OK


def add_parsers(subparsers: "argparse._SubParsersAction[Any]") -> None:
    """Register ``train`` and ``env`` on the command's subparsers."""
    train = subparsers.add_parser("train", help="train or resume a run from a config")
    train.add_argument(
        "items",
        nargs="*",
        metavar="[CONFIG] [key=value]",
        help="a YAML config and overrides such as optim.lr=0.01",
    )
    train.add_argument("--config", help="the YAML config (same as the positional CONFIG)")
    train.add_argument(
        "--nproc", type=int, help="start this many local processes (no cluster needed)"
    )
    train.add_argument(
        "--help-config",
        action="store_true",
        help="list every config section and key with its type, default and meaning",
    )
    train.set_defaults(func=cmd_train)

    env = subparsers.add_parser("env", help="print this process's resolved rank, world and master")
    env.add_argument("--json", action="store_true", help="one JSON object per process")
    env.set_defaults(func=cmd_env)
