"""How complete checkpoints are named, for the store that writes them and for the torch-free
readers that only count them (the job script's policy helper, through `hpcddp.records.attempts`).

A checkpoint is complete when ``step-00000123.pt`` and its ``.sha256`` sidecar both exist.
"""

import re

# Temp files start with a dot: never a match.
CHECKPOINT_NAME = re.compile(r"^step-(\d{8,})\.pt$")
SIDECAR_SUFFIX = ".sha256"


def file_name(step: int) -> str:
    """``step-00000123.pt`` for step 123."""
    return f"step-{step:08d}.pt"
