"""The run directory: created once by rank 0, never silently reused by a different run.

What it holds, and every file's name, is `hpcddp.run_files`'s.

``run.resume=false`` never mixes two runs in one directory: an existing run is refused, or
with ``run.overwrite=true`` moved aside whole; only a requeued attempt of the same Slurm job
(it wrote the directory itself) continues in it.
"""

import dataclasses
import logging
import os
import pathlib
import time
from typing import Any

import yaml

from hpcddp import run_files
from hpcddp.config import Config
from hpcddp.errors import ConfigError
from hpcddp.records import provenance
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
    ("run", "overwrite"),
    ("run", "same_code"),
    ("dist", "socket_ifname"),
    ("train", "stop_after_steps"),
    ("train", "stop_before_end_s"),
    ("train", "log_every_steps"),
    ("dist", "timeout_s"),
    # a checkpoint resumes under either strategy (`hpcddp.train.resharding`)
    ("dist", "strategy"),
    ("dist", "fsdp_blocks"),
    ("dist", "fsdp_reshard_after_forward"),
    ("dist", "fsdp_activation_checkpointing"),
    ("dist", "fsdp_cpu_offload"),
    # a resume loads every weight from the checkpoint: built on meta or whole, the same bits
    ("dist", "fsdp_meta_init"),
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


@dataclasses.dataclass(frozen=True)
class Attempt:
    """Which attempt of which job is preparing the directory, and where it runs."""

    job: str = ""
    restart: int = 0
    nodes: tuple[str, ...] = ()
    gpus: int = 0  # the ranks' GPUs, for the run's cost (`hpcddp report`)
    allocated_nodes: int = 0  # the job's nodes, spares included; 0: as many as ``nodes``


def _holds_a_run(root: pathlib.Path) -> bool:
    markers = (run_files.CONFIG, run_files.METRICS, run_files.SUMMARY, run_files.ATTEMPTS)
    checkpoints = root / run_files.CHECKPOINTS
    return any((root / m).exists() for m in markers) or (
        checkpoints.is_dir() and any(checkpoints.iterdir())
    )


def _written_by(root: pathlib.Path, attempt: Attempt) -> bool:
    """True when an earlier attempt of this very job (a requeue) prepared ``root``."""
    try:
        saved = provenance.load(root) or {}
    except ValueError:
        return False
    return bool(attempt.job) and saved.get("job") == attempt.job


def _move_aside(root: pathlib.Path) -> pathlib.Path:
    """Rename the old run out of the way, whole (a rename: nothing is copied or lost)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = root.with_name(f"{root.name}.old-{stamp}")
    count = 1
    while target.exists():
        count += 1
        target = root.with_name(f"{root.name}.old-{stamp}-{count}")
    os.rename(root, target)
    return target


def _fresh_start(
    config: Config, root: pathlib.Path, attempt: Attempt, lock: RunLock | None
) -> None:
    """``run.resume=false``: refuse a directory holding another run, or move it aside.

    Called with ``lock`` held, so a run still going in ``root`` is never moved from under it.
    """
    if config.run.resume or not _holds_a_run(root) or _written_by(root, attempt):
        return
    if not config.run.overwrite:
        raise ConfigError(
            f"run.resume=false but {root} already holds a run: starting afresh there would mix "
            "the two runs' files (and pruning would keep the old run's higher-numbered "
            "checkpoints). HINT: choose a new run.dir, pass run.overwrite=true to move the old "
            "run aside, or run.resume=true to continue it."
        )
    if lock is not None:
        lock.release()  # it moves with the old run; the new directory gets its own
    moved = _move_aside(root)
    _make(root)
    if lock is not None:
        lock.acquire()
    log.warning("run.overwrite=true: moved the previous run in %s aside to %s", root, moved)


def record_code(config: Config, root: pathlib.Path, attempt: Attempt) -> None:
    """Record the code and versions that run and the job they run in
    (`hpcddp.records.provenance`); say in one line what changed since last time, or refuse it
    under ``run.same_code``. Called once the run directory and the world size are accepted: a
    run refused for its input leaves the record of the code that last ran there."""
    found = provenance.collect([config.model.factory, config.data.factory])
    found["job"] = attempt.job
    try:
        saved = provenance.load(root)
    except ValueError:
        saved = None
    changes = provenance.differences(saved, found) if saved else []
    if changes and config.run.same_code:
        raise ConfigError(
            f"{root} was run with other code ({'; '.join(changes[:3])}), and run.same_code=true "
            "refuses to resume with it. HINT: check out the run's code (RUN_DIR/provenance.json "
            "names the commits; RUN_DIR/provenance/ holds the diffs), or set "
            "run.same_code=false to resume anyway."
        )
    if changes:
        log.warning("resuming %s with other code: %s", root, "; ".join(changes))
    provenance.record(root, found, changed=bool(changes))


def _make(root: pathlib.Path) -> None:
    try:
        (root / run_files.CHECKPOINTS).mkdir(parents=True, exist_ok=True)
        (root / run_files.LOGS).mkdir(exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"cannot create run directory {root}: {err.strerror}. "
            "HINT: set run.dir=<a writable path>."
        ) from None


def prepare(
    config: Config, attempt: Attempt | None = None, *, lock: RunLock | None = None
) -> pathlib.Path:
    """Create the run directory (rank 0), take its ``lock``, refuse a different config or run.

    The code that runs is recorded later (`record_code`), once the world size is accepted too.
    """
    attempt = attempt or Attempt()
    root = pathlib.Path(config.run.dir)
    _make(root)
    if lock is not None:
        lock.acquire()
    _fresh_start(config, root, attempt, lock)
    saved_path = root / run_files.CONFIG
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
