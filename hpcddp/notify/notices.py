"""What a notice says: the JSON body every event shares, and who posts which event.

The body is ``{"event", "run", "name", "job", "step", "text", "time"}``: ``run`` is the run
directory, ``name`` its ``run.name``, ``job`` the Slurm job id (``JOBID_TASKID`` for an array
task) or ``local``; ``text`` is one line for people, which Slack's incoming webhooks show as it is.
"""

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from hpcddp.config import Config
from hpcddp.notify.poster import LEAVE_GRACE_S, Poster
from hpcddp.resilience import deadline
from hpcddp.resilience.requeue import own_job_id


@dataclasses.dataclass(frozen=True)
class Notice:
    """One event of one run, at the step training stands at (or resumes from)."""

    event: str
    run: str
    name: str
    job: str
    step: int
    detail: str = ""

    def body(self) -> dict[str, Any]:
        """The JSON object posted."""
        text = f"hpcddp run {self.name} ({self.run}), job {self.job}: {self.event} at step "
        text += f"{self.step}" + (f": {self.detail}" if self.detail else "")
        return {
            "event": self.event,
            "run": self.run,
            "name": self.name,
            "job": self.job,
            "step": self.step,
            "text": text,
            "time": round(time.time(), 3),
        }


class Notifier:
    """Posts the events ``notify.events`` chose for one run; does nothing without a URL."""

    def __init__(self, config: Config, environ: Mapping[str, str], *, speaks: bool) -> None:
        """``speaks``: this process posts (rank 0, or the batch shell's helper); on every
        other rank the notifier is silent, so no event is posted twice."""
        self.config = config
        self.job = own_job_id(environ) or "local"
        url = config.notify.url if speaks else ""
        self.poster = Poster(url, config.notify.timeout_s) if url else None

    def tell(self, event: str, step: int, detail: str = "") -> None:
        """Post ``event`` in the background, if it is one of those asked for."""
        if self.poster is None or event not in self.config.notify.events:
            return
        run = self.config.run
        self.poster.post(Notice(event, run.dir, run.name, self.job, step, detail).body())

    def close(self, grace_s: float = LEAVE_GRACE_S) -> None:
        """Before the process leaves: a short grace for posts not yet sent, never for answers."""
        if self.poster is not None:
            self.poster.close(grace_s)


def shell_tells_failures(environ: Mapping[str, str]) -> bool:
    """Does hpcddp's job script run this rank? Then its batch shell tells failures (it knows
    whether the job is requeued, restarted or ends), and rank 0 must not tell them again.

    The script's mark is the job end it exports, tagged with its own job id.
    """
    job = environ.get("SLURM_JOB_ID", "")
    return bool(job) and environ.get(deadline.JOB_END_VAR, "").startswith(f"{job}@")
