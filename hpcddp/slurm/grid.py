"""A sweep's grid: read from the command line, expanded into points, each point a config.

``--grid optim.lr=0.001,0.003 --grid run.seed=0,1`` on the command line (`parse_grid`).

Each value is read by the config's own override rule (`hpcddp.config.parse_override`), so
``0.001`` is a float, ``3`` an int, ``true`` a bool and ``[1, 2]`` a list, exactly as in
``optim.lr=0.001``. Commas inside brackets or quotes do not split values. Torch-free.
"""

import itertools
import json
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hpcddp.config import Config, key_path, parse_override, with_values
from hpcddp.errors import ConfigError

HINT = "HINT: --grid optim.lr=0.001,0.003 --grid run.seed=0,1"
_OPEN, _CLOSE, _QUOTES = "[{(", "]})", "'\""


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["optim.lr=0.001,0.003", ...]`` -> ``{"optim.lr": [0.001, 0.003], ...}``, in order."""
    if not items:
        raise ConfigError(f"a sweep needs at least one --grid. {HINT}")
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key_path(key) is None or not raw.strip():
            raise ConfigError(f"--grid {item!r} is not of the form section.key=v1,v2. {HINT}")
        if key in grid:
            raise ConfigError(f"--grid {key} is given twice. HINT: list all its values in one.")
        texts = split_values(raw)
        if any(not text.strip() for text in texts):
            raise ConfigError(f"--grid {item!r} has an empty value. {HINT}")
        values = [parse_override(f"{key}={text.strip()}")[1] for text in texts]
        if len({repr(v) for v in values}) < len(values):
            raise ConfigError(f"--grid {item!r} repeats a value. HINT: list each value once.")
        grid[key] = values
    return grid


def split_values(raw: str) -> list[str]:
    """Split at the commas that are not inside brackets, braces or quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for at, char in enumerate(raw):
        if quote:
            quote = "" if char == quote else quote
        elif char in _QUOTES:
            quote = char
        elif char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(raw[start:at])
            start = at + 1
    return [*parts, raw[start:]]


# -- sweep points -----------------------------------------------------------------------------


def sweep_points(grid: Mapping[str, Sequence[Any]]) -> list[tuple[tuple[str, Any], ...]]:
    """The cartesian product of ``grid``, the first key varying slowest."""
    if not isinstance(grid, Mapping) or not grid:
        raise ConfigError(
            "the sweep grid must be a non-empty mapping of keys to value lists. "
            "HINT: sweep(config, {'optim.lr': [1e-3, 3e-3]})."
        )
    for key, values in grid.items():
        path = key_path(key)
        if path is None or len(path) < 2:
            raise ConfigError(
                f"sweep key {key!r} is not of the form section.key. HINT: e.g. 'optim.lr'."
            )
        if path[0] == "slurm" or key == "run.dir":
            raise ConfigError(
                f"sweep key {key!r} cannot vary within one job array (every "
                "point shares the resources and gets its own run.dir). HINT: "
                "submit separate sweeps instead."
            )
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ConfigError(
                f"sweep values for {key} must be a non-empty list, got "
                f"{values!r}. HINT: {{'{key}': [a, b]}}."
            )
        _check_plain(key, values)
    return [tuple(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def _check_plain(key: str, values: Sequence[Any]) -> None:
    """Grid values name run directories and are recorded in sweep.json: plain data only."""
    try:
        json.dumps(list(values), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"sweep values for {key} must be plain numbers, strings, booleans or lists ({err}). "
            f"HINT: e.g. {{'{key}': [0.001, 0.003]}}, with float(x) for a numpy value."
        ) from None


def point_config(base: Config, index: int, point: Sequence[tuple[str, Any]]) -> Config:
    """The base config with one point's values and its own run directory, checked."""
    run_dir = str(pathlib.Path(base.run.dir) / run_dir_name(index, point))
    values = [(key.split("."), value) for key, value in point] + [(["run", "dir"], run_dir)]
    try:
        return with_values(base, values)
    except ConfigError as err:
        raise ConfigError(f"sweep point {index} ({_describe(point)}): {err}") from None


_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]+")


def run_dir_name(index: int, point: Sequence[tuple[str, Any]], max_chars: int = 120) -> str:
    """``3-optim.lr=0.001,train.epochs=2``: the index keeps names unique, the rest is for people."""
    return f"{index}-{_UNSAFE.sub('_', _describe(point))}"[:max_chars]


def _describe(point: Sequence[tuple[str, Any]]) -> str:
    return ",".join(f"{key}={_text(value)}" for key, value in point)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
