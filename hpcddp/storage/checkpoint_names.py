"""How complete checkpoints are named, for the store that writes them and for the torch-free
readers that only count them (the job script's policy helper, through `hpcddp.records.attempts`).

A checkpoint is complete when ``step-00000123.pt`` and its sidecar both exist. A sidecar is named
for the digest it holds: ``step-00000123.pt.xxh3`` (`hpcddp.storage.digest`). Versions before
wrote ``step-00000123.pt.sha256`` (holding an XXH3-128, or earlier a sha256): still read, and
replaced by an ``.xxh3`` when that step is saved again.

Under ``dist.strategy=fsdp`` (`hpcddp.storage.sharded`) a checkpoint is the folder
``step-00000123.dcp``, complete when it holds its ``COMPLETE`` marker, written last.
"""

import os
import re

# Temp files start with a dot: never a match.
CHECKPOINT_NAME = re.compile(r"^step-(\d{8,})\.pt$")
SIDECAR_SUFFIX = ".xxh3"  # what a save writes
OLDER_SIDECAR_SUFFIXES = (".sha256",)  # what earlier versions wrote; read, never written
SIDECAR_SUFFIXES = (SIDECAR_SUFFIX, *OLDER_SIDECAR_SUFFIXES)  # the order a reader tries them


def file_name(step: int) -> str:
    """``step-00000123.pt`` for step 123."""
    return f"step-{step:08d}.pt"


def has_sidecar(name: str, names: set[str]) -> bool:
    """Whether checkpoint ``name`` has a sidecar (of any version) among ``names``."""
    return any(name + suffix in names for suffix in SIDECAR_SUFFIXES)


def payload_of(sidecar_name: str) -> str | None:
    """The checkpoint name a sidecar (of any version) belongs to; None for another name."""
    for suffix in SIDECAR_SUFFIXES:
        if sidecar_name.endswith(suffix):
            return sidecar_name.removesuffix(suffix)
    return None


SHARDED_NAME = re.compile(r"^step-(\d{8,})\.dcp$")
MARKER = "COMPLETE"


def sharded_name(step: int) -> str:
    """``step-00000123.dcp`` for step 123: a folder of every rank's shards."""
    return f"step-{step:08d}.dcp"


def sharded_complete_steps(folder: str | os.PathLike[str]) -> list[int]:
    """Steps of the sharded checkpoints in ``folder`` whose marker is written, oldest first."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = [int(m[1]) for n in names if (m := SHARDED_NAME.match(n))]
    return sorted(s for s in found if os.path.exists(os.path.join(folder, sharded_name(s), MARKER)))
