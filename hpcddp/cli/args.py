"""Command-line pieces several subcommands share: ``[CONFIG] [key=value ...]`` and Slurm options."""

import argparse
import os
from collections.abc import Sequence
from typing import Any

from hpcddp.errors import ConfigError
from hpcddp.slurm.options import OPTIONS, Option


def is_config_path(item: str) -> bool:
    """An item is the config file if it has no ``=``, or names a file or a .yaml anyway."""
    return "=" not in item or item.endswith((".yaml", ".yml")) or os.path.isfile(item)


def split_config_and_overrides(
    items: Sequence[str], config: str | None = None
) -> tuple[str | None, list[str]]:
    """``[CONFIG] [key=value ...]``: the one item that is not an override is the config file."""
    overrides = [item for item in items if not is_config_path(item)]
    paths = [item for item in items if is_config_path(item)]
    if len(paths) + (config is not None) > 1:
        raise ConfigError(
            f"more than one config file given ({', '.join(paths)}). "
            "HINT: pass one CONFIG and key=value overrides."
        )
    return (config or (paths[0] if paths else None)), overrides


def add_slurm_options(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per row of the option table (`OPTIONS`), stored under its parsed name."""
    for name, option in OPTIONS.items():
        typed: dict[str, Any] = (
            {"action": argparse.BooleanOptionalAction}
            if option.kind is bool
            else {"type": option.kind, "metavar": option.metavar}
        )
        parser.add_argument(
            option.flag.cli,
            dest=name,
            default=None,
            help=f"{option.text} ({_example(option)}default: the config's slurm.{option.field})",
            **typed,
        )


def _example(option: Option) -> str:
    """``e.g. VALUE; `` for ``--help``; nothing for a flag, which takes no value."""
    return "" if option.kind is bool else f"e.g. {option.flag.example}; "


def add_cluster_option(parser: argparse.ArgumentParser) -> None:
    """``--cluster slurm|local``, as `hpcddp.slurm.submission.choose_cluster` reads it."""
    parser.add_argument(
        "--cluster",
        choices=("slurm", "local"),
        default=None,
        help="where to run (default: Slurm when sbatch and a controller answer, else this machine)",
    )
