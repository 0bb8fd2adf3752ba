"""Keep-N pruning over both kinds of checkpoint, whole (``.pt``, ddp) and sharded (``.dcp``,
fsdp), counted together.

A run that changed ``dist.strategy`` has checkpoints of both kinds in one folder; each store
pruning only its own kind would keep the other's forever (and count them as nothing). So every
save prunes the complete checkpoints of either kind beyond the newest ``keep_last`` steps,
never the step just written, and so never the newest complete one. Torn saves are not counted
here: each store removes its own debris.
"""

import logging
import os
import pathlib
import shutil

from hpcddp.storage import atomic
from hpcddp.storage.checkpoint_names import (
    CHECKPOINT_NAME,
    MARKER,
    SIDECAR_SUFFIXES,
    sharded_complete_steps,
    sharded_name,
)

log = logging.getLogger(__name__)


def complete_steps(directory: pathlib.Path) -> dict[int, list[pathlib.Path]]:
    """``{step: [checkpoints]}`` of every complete checkpoint, whole or sharded."""
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    found: dict[int, list[pathlib.Path]] = {}
    for name in sorted(names):
        # the payload is renamed into place after its sidecar: it is complete
        if whole := CHECKPOINT_NAME.match(name):
            found.setdefault(int(whole[1]), []).append(directory / name)
    for step in sharded_complete_steps(directory):
        found.setdefault(step, []).append(directory / sharded_name(step))
    return found


def prune(directory: pathlib.Path, keep_last: int, keep_step: int) -> None:
    """Remove complete checkpoints of any kind beyond the newest ``keep_last`` steps, never
    those of ``keep_step``; what makes one complete goes first (a sharded folder's marker, a
    whole one's payload before its sidecar), so a crash halfway leaves debris, never a
    checkpoint that looks complete and is not."""
    found = complete_steps(directory)
    kept = set(sorted(found)[-keep_last:]) | {keep_step}
    for step, paths in found.items():
        if step in kept:
            continue
        for path in paths:
            _remove(path)
            log.debug("pruned checkpoint %s", path)


def _remove(path: pathlib.Path) -> None:
    if path.suffix == ".dcp":
        atomic.unlink_quietly(path / MARKER)
        shutil.rmtree(path, ignore_errors=True)
        return
    atomic.unlink_quietly(path)
    for suffix in SIDECAR_SUFFIXES:
        atomic.unlink_quietly(path.with_name(path.name + suffix))
