"""How a run ended, as its summary says: the verdict `hpcddp status` and a chain's links
(deciding whether to carry on) read from it (`hpcddp.run_files.read_summary`).

Only a summary written since the job was submitted counts (minus a second of clock slack): a
summary left by an earlier run in the same directory says nothing about this job.
"""

import dataclasses
import os

from hpcddp.run_files import SUMMARY, DamagedSummary, read_summary


@dataclasses.dataclass(frozen=True)
class RunEnd:
    """What a fresh summary says: completed, failed with a reason, or unreadable."""

    failed: bool = False
    reason: str = ""
    damaged: bool = False


def read(run_dir: str | os.PathLike[str], since: float) -> RunEnd | None:
    """The run's end, or None when no summary was written since ``since`` (epoch s)."""
    try:
        summary = read_summary(run_dir, since=since)
    except DamagedSummary:
        return RunEnd(damaged=True)
    if summary is None:
        return None
    if summary.failed:
        return RunEnd(failed=True, reason=summary.reason or f"see {SUMMARY}")
    return RunEnd()
