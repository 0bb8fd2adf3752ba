"""How a run ended, as its ``summary.json`` says: the one reader of that file's verdict for
`hpcddp status` and for a chain's links deciding whether to carry on.

Only a file written since the job was submitted counts (minus a second of clock slack): a
summary left by an earlier run in the same directory says nothing about this job.
"""

import dataclasses
import json
import os
import pathlib

SUMMARY = "summary.json"


@dataclasses.dataclass(frozen=True)
class RunEnd:
    """What a fresh summary.json says: completed, failed with a reason, or unreadable."""

    failed: bool = False
    reason: str = ""
    damaged: bool = False


def read(run_dir: str | os.PathLike[str], since: float) -> RunEnd | None:
    """The run's end, or None when no summary.json was written since ``since`` (epoch s)."""
    path = pathlib.Path(run_dir) / SUMMARY
    try:
        if path.stat().st_mtime < since - 1:
            return None
    except OSError:
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return RunEnd(damaged=True)
    if isinstance(summary, dict) and summary.get("status") == "failed":
        return RunEnd(failed=True, reason=str(summary.get("reason", f"see {SUMMARY}")))
    return RunEnd()
