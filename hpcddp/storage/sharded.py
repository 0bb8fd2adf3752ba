"""Sharded checkpoints on disk (``dist.strategy=fsdp``): one folder per step, complete only when
its marker is.

Layout: ``<run_dir>/checkpoints/step-00000123.dcp/`` holds every rank's shard files and the
``.metadata`` that torch.distributed.checkpoint (DCP) writes, ``extras.pt`` (the scheduler,
scaler, progress and every rank's RNG: small, rank 0's), and ``COMPLETE``, written last by rank
0 once every rank's shards and the metadata are durable. The marker lists each file's size and
its XXH3-128 digest (`hpcddp.storage.digest`; each rank hashes the shards it wrote, in the
background write, and rank 0 the rest), so a shard truncated, lost or flipped afterwards is
noticed: sizes before loading, digests while loading (`hpcddp.storage.sharded_reader`). A
folder without its marker (a save interrupted by a killed rank, a full disk) is never loaded;
the next save removes it. Pruning (`hpcddp.storage.pruning`) counts whole and sharded
checkpoints together.
"""

import json
import logging
import os
import pathlib
import shutil
import time
from typing import Any

from hpcddp.errors import CheckpointError
from hpcddp.run_files import CHECKPOINTS
from hpcddp.storage import atomic, digest, pruning
from hpcddp.storage.checkpoint_names import (
    MARKER,
    SHARDED_NAME,
    sharded_complete_steps,
    sharded_name,
)

log = logging.getLogger(__name__)
EXTRAS = "extras.pt"


class ShardedStore:
    """Step folders of sharded checkpoints; rank 0 opens, completes and prunes them."""

    def __init__(self, run_dir: str | os.PathLike[str], keep_last: int = 3) -> None:
        self.directory = pathlib.Path(run_dir) / CHECKPOINTS
        self.keep_last = keep_last

    def path_for(self, step: int) -> pathlib.Path:
        return self.directory / sharded_name(step)

    def list_complete(self) -> list[tuple[int, pathlib.Path]]:
        """``(step, folder)`` of every folder whose marker is written, oldest first."""
        return [(s, self.path_for(s)) for s in sharded_complete_steps(self.directory)]

    def latest_step(self) -> int | None:
        complete = self.list_complete()
        return complete[-1][0] if complete else None

    def open(self, step: int) -> pathlib.Path:
        """Rank 0, before any rank writes: an empty folder for ``step``; torn folders (no
        marker) of earlier saves removed. A complete folder of the same step is replaced."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in os.listdir(self.directory):
            folder = self.directory / name
            if SHARDED_NAME.match(name) and not (folder / MARKER).exists():
                log.info("removing %s, left behind by an interrupted save", folder)
                shutil.rmtree(folder, ignore_errors=True)
        path = self.path_for(step)
        if path.exists():
            atomic.unlink_quietly(path / MARKER)
            atomic.fsync_dir(path)
            shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        return path

    def complete(
        self, step: int, meta: dict[str, Any], digests: dict[str, str] | None = None
    ) -> None:
        """Rank 0, after every rank's shards and the metadata are written: the marker, then
        pruning. The marker holds each file's size and digest: ``digests`` (each rank's of the
        shards it wrote); any other file is hashed here. The folder is fsynced before it."""
        path = self.path_for(step)
        files = {f.name: f.stat().st_size for f in sorted(path.iterdir()) if f.name != MARKER}
        if ".metadata" not in files:
            raise CheckpointError(
                f"sharded checkpoint {path} has no .metadata after every rank wrote; not marked "
                "complete. HINT: check that run.dir is a file system every node shares."
            )
        given = digests or {}
        tokens = {n: given.get(n) or digest.of_file(path / n)[0] for n in files}
        atomic.fsync_dir(path)
        record = {
            **meta,
            "step": step,
            "files": files,
            "digests": tokens,
            "written": round(time.time(), 3),
        }
        atomic.atomic_write_text(path / MARKER, json.dumps(record, indent=1))
        atomic.fsync_dir(self.directory)
        pruning.prune(self.directory, self.keep_last, keep_step=step)

    def check(self, path: pathlib.Path) -> dict[str, Any]:
        """The marker's record, if every file it lists is there with its size; else
        CheckpointError (resume then falls back to an older checkpoint)."""
        try:
            record = json.loads((path / MARKER).read_text())
            files = record["files"]
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(
                f"sharded checkpoint {path} has no readable marker: {exc}"
            ) from exc
        for name, size in files.items():
            try:
                actual = (path / name).stat().st_size
            except OSError:
                actual = -1
            if actual != size:
                raise CheckpointError(
                    f"sharded checkpoint {path}: {name} is {actual} bytes, the marker says "
                    f"{size}. HINT: it was truncated or removed after saving; resume falls back "
                    "to an older checkpoint."
                )
        return record


def digests_of(path: pathlib.Path, names: list[str]) -> dict[str, str]:
    """``{name: xxh3-128 token}`` of the files ``names`` in ``path`` (a rank's own shards,
    hashed after DCP wrote them, while they are in the page cache)."""
    return {name: digest.of_file(path / name)[0] for name in names}


def verify_file(path: pathlib.Path, record: dict[str, Any]) -> None:
    """CheckpointError unless ``path``'s bytes match the marker's digest (none recorded:
    a checkpoint of an earlier version, checked by size alone)."""
    expected = record.get("digests", {}).get(path.name)
    if expected is None:
        return
    actual, _ = digest.of_file(path, digest.scheme_of(expected))
    if actual != expected:
        raise CheckpointError(mismatch(path, expected, actual))


def mismatch(path: pathlib.Path, expected: str, actual: str) -> str:
    """One line on a file whose bytes are not what was written."""
    return (
        f"sharded checkpoint {path.parent}: {path.name} does not match its digest "
        f"({actual[-12:]}, the marker says {expected[-12:]}). HINT: it was corrupted after "
        "saving; resume falls back to an older checkpoint."
    )
