"""A sweep directory that knows itself: ``SWEEP_DIR/sweep.json``, the sweep's manifest.

`hpcddp.sweep` (and ``hpcddp sweep``) write it when they submit, ``--retry-failed`` adds to it,
and ``hpcddp status|plot|report SWEEP_DIR`` read it, so they all work from the directory alone
(no job index, no Slurm memory needed). It is rewritten whole and atomically, never appended::

    {
      "format": 1,
      "grid": {"optim.lr": [0.001, 0.003], "train.seed": [0, 1]},
      "points": [
        {"index": 0, "grid": {"optim.lr": 0.001, "train.seed": 0},
         "run_dir": "/abs/SWEEP_DIR/0-optim.lr=0.001,train.seed=0"}, ...
      ],
      "arrays": [
        {"job_id": "123", "cluster": "slurm", "submitted_at": 1764000000.0,
         "tasks": [{"index": 0, "job": "123_0", "stdout": "...", "stderr": "..."}, ...]}, ...
      ],
      "max_parallel": null,
      "config": {...}
    }

``points`` are the grid's cartesian product (the first key varies slowest); ``index`` is a
point's number, the prefix of its run directory. ``arrays`` lists every job array submitted, in
order: each task names the point it runs (``index``) and its job (``JOBID_TASKID`` on Slurm,
``local-PID`` on this machine), so a point's latest attempt is the last task naming it.
``config`` is the checked base config (``Config.to_dict``) that a retry rebuilds the points
from. Torch-free: the login node reads it.
"""

import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import Any

from hpcddp import run_files
from hpcddp.errors import ConfigError
from hpcddp.storage.atomic import atomic_write_text

FILE = run_files.SWEEP_MANIFEST
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Point:
    """One point of the grid: its number, its grid values and its own run directory."""

    index: int
    grid: dict[str, Any]
    run_dir: str


@dataclasses.dataclass(frozen=True)
class Task:
    """One array task: which point it runs, its job name and its output files."""

    index: int
    job: str
    stdout: str
    stderr: str


@dataclasses.dataclass(frozen=True)
class Array:
    """One job array submitted for the sweep (the first, or a retry)."""

    job_id: str
    cluster: str
    submitted_at: float
    tasks: tuple[Task, ...]


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What ``sweep.json`` holds (see the module docstring)."""

    grid: dict[str, list[Any]]
    points: tuple[Point, ...]
    arrays: tuple[Array, ...] = ()
    max_parallel: int | None = None
    config: dict[str, Any] = dataclasses.field(default_factory=dict)

    def with_array(self, array: Array) -> "Manifest":
        """The same manifest with one more array submitted."""
        return dataclasses.replace(self, arrays=(*self.arrays, array))

    def latest(self, index: int) -> tuple[Array, Task] | None:
        """The last task submitted for point ``index``, and its array (None: never submitted)."""
        found = [(a, t) for a in self.arrays for t in a.tasks if t.index == index]
        return found[-1] if found else None

    def submissions(self, index: int) -> int:
        """How many jobs have been submitted for point ``index``."""
        return sum(1 for a in self.arrays for t in a.tasks if t.index == index)


def path(sweep_dir: str | pathlib.Path) -> pathlib.Path:
    """Where the manifest of ``sweep_dir`` lives."""
    return pathlib.Path(sweep_dir) / FILE


def is_sweep_dir(sweep_dir: str | pathlib.Path) -> bool:
    """True when ``sweep_dir`` holds a manifest."""
    return path(sweep_dir).is_file()


def write(sweep_dir: str | pathlib.Path, manifest: Manifest) -> pathlib.Path:
    """Save the manifest whole (atomically: a reader never sees half a file)."""
    text = encode(manifest)
    target = path(sweep_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, text)
    return target


def encode(manifest: Manifest) -> str:
    """The manifest as JSON text, or a one-line ConfigError naming a value JSON cannot hold
    (checked before a sweep is submitted, so no array goes out unrecorded)."""
    data = {"format": FORMAT, **dataclasses.asdict(manifest)}
    try:
        return json.dumps(data, indent=1, allow_nan=False) + "\n"
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"the sweep cannot be recorded in {FILE}: {err}. HINT: use plain numbers, strings, "
            "booleans and lists as grid values and settings."
        ) from None


def read(sweep_dir: str | pathlib.Path) -> Manifest:
    """The manifest of ``sweep_dir``, or a one-line ConfigError saying what is wrong."""
    target = path(sweep_dir)
    try:
        data = json.loads(target.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{sweep_dir} is not a sweep directory (no {FILE}). HINT: pass the run.dir "
            "that `hpcddp sweep` printed."
        ) from None
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{target} is unreadable ({err}). HINT: restore it from a copy."
        ) from None
    try:
        return _manifest(data)
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(
            f"{target} is not a sweep manifest of format {FORMAT} ({type(err).__name__}: {err}). "
            "HINT: it is written by `hpcddp sweep`; do not edit it by hand."
        ) from None


def _manifest(data: dict[str, Any]) -> Manifest:
    if data.get("format") != FORMAT:
        raise ValueError(f"format {data.get('format')!r}")
    arrays = tuple(
        Array(
            job_id=str(a["job_id"]),
            cluster=str(a["cluster"]),
            submitted_at=float(a["submitted_at"]),
            tasks=tuple(Task(**t) for t in a["tasks"]),
        )
        for a in data["arrays"]
    )
    return Manifest(
        grid=dict(data["grid"]),
        points=tuple(Point(**p) for p in data["points"]),
        arrays=arrays,
        max_parallel=data.get("max_parallel"),
        config=dict(data.get("config") or {}),
    )


def labels(points: Sequence[Point]) -> dict[int, str]:
    """``lr=0.001 seed=0`` for each point: its grid values, each key by its last part unless
    two keys share that part (then in full)."""
    keys = list(dict.fromkeys(key for point in points for key in point.grid))
    last = [key.rsplit(".", 1)[-1] for key in keys]
    short = {
        key: (tail if last.count(tail) == 1 else key) for key, tail in zip(keys, last, strict=True)
    }
    return {
        point.index: " ".join(f"{short[k]}={_text(v)}" for k, v in point.grid.items())
        for point in points
    }


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (int, str)):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
