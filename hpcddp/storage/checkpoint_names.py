"""How complete checkpoints are named, for the store that writes them and for the torch-free
readers that only count them (the job script's policy helper, through `hpcddp.storage.attempts`).

A checkpoint is complete when ``step-00000123.pt`` and its ``.sha256`` sidecar both exist, or
(``dist.strategy=fsdp``, `hpcddp.storage.sharded`) when the folder ``step-00000123.dcp`` holds
its ``COMPLETE`` marker, written last.
"""

import os
import re

# Temp files start with a dot: never a match.
CHECKPOINT_NAME = re.compile(r"^step-(\d{8,})\.pt$")
SIDECAR_SUFFIX = ".sha256"


def file_name(step: int) -> str:
    """``step-00000123.pt`` for step 123."""
    return f"step-{step:08d}.pt"


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
