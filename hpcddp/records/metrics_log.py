"""``metrics.jsonl``: one JSON line per logged step and evaluation, written by rank 0.

Append-only while a run goes on; a resumed run first drops what its previous attempt logged
after the checkpoint it resumes from, so every step appears once, and marks where it resumed
(``{"event": "resumed", ...}``: the plot draws it as a line). Every record also goes to the
experiment trackers, if any (`hpcddp.records.tracking`), which keep the same promise.
"""

import json
import logging
import pathlib
import time
from typing import Any

from hpcddp.records.tracking import Tracker
from hpcddp.storage.atomic import atomic_write_text

log = logging.getLogger(__name__)


class MetricsLog:
    """Append-only ``metrics.jsonl`` on rank 0; a resumed run drops lines past its checkpoint."""

    def __init__(
        self,
        path: pathlib.Path,
        resume_step: int,
        tracker: Tracker | None = None,
        slurm_restart_count: str = "",
    ) -> None:
        self.path = path
        self._drop_after(resume_step)
        self._file = path.open("a", buffering=1)
        self._start = time.time()
        self.tracker = tracker
        if resume_step:
            restarts = slurm_restart_count  # from the resolved environment (`DistEnv.environ`)
            self.write(step=resume_step, event="resumed", slurm_restart_count=restarts)

    def _drop_after(self, step: int) -> None:
        """Forget what an interrupted run logged after its last checkpoint."""
        if not self.path.exists():
            return
        kept = [
            line
            for number, line in enumerate(self.path.read_text().splitlines(), 1)
            if line.strip() and self._step_of(line, number) <= step
        ]
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def _step_of(self, line: str, number: int) -> float:
        """The line's step; an unreadable line (cut short by a crash or a full disk) is dropped."""
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            log.warning(
                "%s line %d is not a JSON record (cut short?); dropping it", self.path, number
            )
            return float("inf")
        step = record.get("step", 0)
        return step if isinstance(step, (int, float)) else 0

    def write(self, **record: Any) -> None:
        """One JSON line, with wall time since this process started logging."""
        record.setdefault("time_s", round(time.time() - self._start, 3))
        self._file.write(json.dumps(record) + "\n")
        if self.tracker is not None and "event" not in record:
            self.tracker.log(int(record.get("step", 0)), record)

    def close(self, ending: str = "stopped") -> None:
        """Flush and close the file and the trackers, telling them how this attempt ended
        (`hpcddp.records.tracking.ENDINGS`)."""
        self._file.close()
        if self.tracker is not None:
            self.tracker.close(ending)
