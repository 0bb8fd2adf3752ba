"""What a notice says: one event of one run, as JSON for scripts and as a line for people.

The JSON body is ``{"event", "run", "name", "job", "step", "text", "time"}``: ``run`` is the
run directory, ``name`` its ``run.name``, ``job`` the Slurm job id (``JOBID_TASKID`` for an
array task) or ``local``; ``text`` is one line for people.
"""

import dataclasses
import time
from typing import Any

from hpcddp.run_events import Event


@dataclasses.dataclass(frozen=True)
class Notice:
    """One event of one run, at the step training stands at (or resumes from)."""

    event: Event
    run: str
    name: str
    job: str
    step: int
    detail: str = ""  # why, or what follows: "checkpoint saved, requeueing"
    host: str = ""  # the host that tells it: rank 0's, or the batch shell's

    def body(self) -> dict[str, Any]:
        """The JSON object a plain webhook gets (``notify.url``)."""
        text = f"hpcddp run {self.name} ({self.run}), job {self.job}: {self.event.value} at step "
        text += f"{self.step}" + (f": {self.detail}" if self.detail else "")
        return {
            "event": self.event.value,
            "run": self.run,
            "name": self.name,
            "job": self.job,
            "step": self.step,
            "text": text,
            "time": round(time.time(), 3),
        }

    def chat_line(self) -> str:
        """The line a chat channel shows (``notify.slack_url``): run, event, step, host, why.

        ``hpcddp quickstart: preempted at step 40 on c1n2 (job 12): checkpoint saved, ...``
        """
        where = f" on {self.host}" if self.host else ""
        line = f"hpcddp {self.name}: {self.event.value} at step {self.step}{where} (job {self.job})"
        return line + (f": {self.detail}" if self.detail else "")
