"""The run directory: created once by rank 0, never silently reused by a different run.

Layout::

    RUN_DIR/config.yaml      the resolved configuration
    RUN_DIR/checkpoints/     step-numbered, complete checkpoints only
    RUN_DIR/logs/rank-N.log  one log per rank
    RUN_DIR/metrics.jsonl    one line per logged step and evaluation
    RUN_DIR/summary.json     written when the run completes
"""

import json
import logging
import pathlib
import time

import yaml

from hpcddp.atomic import atomic_write_text
from hpcddp.config import Config
from hpcddp.errors import ConfigError

log = logging.getLogger(__name__)

# Keys that may change between a run and its resumption without changing what is computed.
# run.dir and run.name: the same directory may be reached by another spelling of its path.
# Not data.num_workers: a dataset that draws randomness in its workers changes with their count.
RESUMABLE_CHANGES = {
    ("run", "dir"), ("run", "name"), ("run", "resume"), ("run", "force"),
    ("train", "stop_after_steps"), ("train", "stop_before_end_s"),
    ("train", "log_every_steps"), ("dist", "timeout_s"),
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


def prepare(config: Config) -> pathlib.Path:
    """Create the run directory (rank 0), refusing one written by a different config."""
    root = pathlib.Path(config.run.dir)
    try:
        (root / "checkpoints").mkdir(parents=True, exist_ok=True)
        (root / "logs").mkdir(exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create run directory {root}: {err.strerror}. "
                          "HINT: set run.dir=<a writable path>.") from None
    saved_path = root / "config.yaml"
    if saved_path.exists() and not config.run.force:
        diffs = config_differences(yaml.safe_load(saved_path.read_text()) or {}, config.to_dict())
        if diffs:
            raise ConfigError(
                f"run directory {root} holds a run with a different config ({'; '.join(diffs[:3])}"
                f"{'; ...' if len(diffs) > 3 else ''}). HINT: choose a new run.dir, or pass "
                "run.force=true to continue it with the new config.")
    atomic_write_text(saved_path, config.to_yaml())
    return root


class MetricsLog:
    """Append-only ``metrics.jsonl`` on rank 0; a resumed run drops lines past its checkpoint."""

    def __init__(self, path: pathlib.Path, resume_step: int) -> None:
        self.path = path
        self._drop_after(resume_step)
        self._file = path.open("a", buffering=1)
        self._start = time.time()

    def _drop_after(self, step: int) -> None:
        """Forget what an interrupted run logged after its last checkpoint."""
        if not self.path.exists():
            return
        kept = [line for number, line in enumerate(self.path.read_text().splitlines(), 1)
                if line.strip() and self._step_of(line, number) <= step]
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def _step_of(self, line: str, number: int) -> float:
        """The line's step; an unreadable line (cut short by a crash or a full disk) is dropped."""
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            log.warning("%s line %d is not a JSON record (cut short?); dropping it",
                        self.path, number)
            return float("inf")
        step = record.get("step", 0)
        return step if isinstance(step, (int, float)) else 0

    def write(self, **record) -> None:
        """One JSON line, with wall time since this process started logging."""
        record.setdefault("time_s", round(time.time() - self._start, 3))
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Flush and close the file."""
        self._file.close()
