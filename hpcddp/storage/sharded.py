"""Sharded checkpoints on disk (``dist.strategy=fsdp``): one folder per step, complete only when
its marker is.

Layout: ``<run_dir>/checkpoints/step-00000123.dcp/`` holds every rank's shard files and the
``.metadata`` that torch.distributed.checkpoint (DCP) writes, ``extras.pt`` (the scheduler,
scaler, progress and every rank's RNG: small, rank 0's), and ``COMPLETE``, written last by rank
0 once every rank's shards and the metadata are durable. The marker lists each file's size, so
a shard truncated or lost afterwards is noticed before loading. A folder without its marker (a
save interrupted by a killed rank, a full disk) is never loaded; the next save removes it.
Pruning keeps the newest ``keep_last`` complete folders and never the one just written; a
``.pt`` checkpoint of the same run (written under ``dist.strategy=ddp``) counts as older work.
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
from hpcddp.storage import atomic
from hpcddp.storage.checkpoint_names import (
    CHECKPOINT_NAME,
    MARKER,
    SHARDED_NAME,
    payload_of,
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

    def complete(self, step: int, meta: dict[str, Any]) -> None:
        """Rank 0, after every rank's shards and the metadata are written: the marker, then
        pruning. The files' sizes go into the marker; the folder is fsynced before it."""
        path = self.path_for(step)
        files = {f.name: f.stat().st_size for f in sorted(path.iterdir()) if f.name != MARKER}
        if ".metadata" not in files:
            raise CheckpointError(
                f"sharded checkpoint {path} has no .metadata after every rank wrote; not marked "
                "complete. HINT: check that run.dir is a file system every node shares."
            )
        atomic.fsync_dir(path)
        record = {**meta, "step": step, "files": files, "written": round(time.time(), 3)}
        atomic.atomic_write_text(path / MARKER, json.dumps(record, indent=1))
        atomic.fsync_dir(self.directory)
        self._prune(keep_step=step)

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

    def _prune(self, keep_step: int) -> None:
        """Folders beyond the newest ``keep_last`` complete ones go, and ``.pt`` checkpoints
        older than all of those (a run that moved from ddp to fsdp); never ``keep_step``."""
        complete = self.list_complete()
        kept = {s for s, _ in complete[-self.keep_last :]} | {keep_step}
        for step, path in complete:
            if step not in kept:
                atomic.unlink_quietly(path / MARKER)  # the marker first: never half a checkpoint
                shutil.rmtree(path, ignore_errors=True)
                log.debug("pruned checkpoint %s", path)
        if len(kept) < self.keep_last:
            return
        for name in sorted(os.listdir(self.directory)):  # a payload before its sidecar
            whole = CHECKPOINT_NAME.match(payload_of(name) or name)  # a sidecar of any version
            if whole and int(whole[1]) < min(kept):
                atomic.unlink_quietly(self.directory / name)
