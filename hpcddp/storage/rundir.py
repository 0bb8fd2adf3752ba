"""The run directory: created once by rank 0, never silently reused by a different run.

Layout::

    RUN_DIR/config.yaml      the resolved configuration
    RUN_DIR/checkpoints/     step-numbered, complete checkpoints only
    RUN_DIR/logs/rank-N.log  one log per rank
    RUN_DIR/metrics.jsonl    one line per logged step and evaluation (`hpcddp.storage.metrics`)
    RUN_DIR/summary.json     written when the run completes
"""

import logging
import pathlib
from typing import Any

import yaml

from hpcddp.config import Config
from hpcddp.errors import ConfigError
from hpcddp.storage.atomic import atomic_write_text
from hpcddp.storage.runlock import RunLock

log = logging.getLogger(__name__)

# Keys that may change between a run and its resumption without changing what is computed.
# run.dir and run.name: the same directory may be reached by another spelling of its path.
# Not data.num_workers: a dataset that draws randomness in its workers changes with their count.
RESUMABLE_CHANGES = {
    ("run", "dir"),
    ("run", "name"),
    ("run", "resume"),
    ("run", "force"),
    ("train", "stop_after_steps"),
    ("train", "stop_before_end_s"),
    ("train", "log_every_steps"),
    ("dist", "timeout_s"),
    ("slurm",),
}


def _comparable(data: dict) -> dict:
    """The parts of a config that decide the result of the run."""
    out = {}
    for section, values in data.items():
        if (section,) in RESUMABLE_CHANGES or not isinstance(values, dict):
            continue
        out[section] = {k: v for k, v in values.items() if (section, k) not in RESUMABLE_CHANGES}
    return out


def config_differences(saved: dict, current: dict) -> list[str]:
    """``section.key: old -> new`` for every result-changing key that differs."""
    old, new = _comparable(saved), _comparable(current)
    diffs = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                diffs.append(f"{section}.{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return diffs


def prepare(config: Config, lock: RunLock | None = None) -> pathlib.Path:
    """Create the run directory (rank 0), take its ``lock``, refuse a different config."""
    root = pathlib.Path(config.run.dir)
    try:
        (root / "checkpoints").mkdir(parents=True, exist_ok=True)
        (root / "logs").mkdir(exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"cannot create run directory {root}: {err.strerror}. "
            "HINT: set run.dir=<a writable path>."
        ) from None
    if lock is not None:
        lock.acquire()
    saved_path = root / "config.yaml"
    if saved_path.exists() and not config.run.force:
        diffs = config_differences(_saved_config(saved_path), config.to_dict())
        if diffs:
            raise ConfigError(
                f"run directory {root} holds a run with a different config ({'; '.join(diffs[:3])}"
                f"{'; ...' if len(diffs) > 3 else ''}). HINT: choose a new run.dir, or pass "
                "run.force=true to continue it with the new config."
            )
    atomic_write_text(saved_path, config.to_yaml())
    return root


def _saved_config(path: pathlib.Path) -> dict[str, Any]:
    """The config a run directory was written with; a damaged one is reported, not crashed on."""
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        problem = getattr(err, "problem", None) or getattr(err, "strerror", None) or err
        saved = f"unreadable ({problem})"
    if not isinstance(saved, dict):
        raise ConfigError(
            f"{path} is damaged: {saved if isinstance(saved, str) else 'not a mapping'}. "
            "HINT: restore it from the run's first config, or pass run.force=true to replace it."
        )
    return saved
