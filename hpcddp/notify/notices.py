"""Who posts which event: the `Notifier` one process holds, sending to the configured sinks.

Rank 0 tells what it sees (`hpcddp.train.run_notices`); the batch shell's policy helper tells
failures once it knows what follows (`shell_tells_failures` keeps rank 0 from telling them
twice).
"""

import socket
from collections.abc import Mapping

from hpcddp.config import Config
from hpcddp.notify.notice import Notice
from hpcddp.notify.poster import LEAVE_GRACE_S
from hpcddp.notify.sinks import Sink, close_all, sinks_for
from hpcddp.resilience import deadline
from hpcddp.resilience.requeue import own_job_id
from hpcddp.run_events import Event


class Notifier:
    """Tells the events ``notify.events`` chose for one run to every sink configured."""

    def __init__(self, config: Config, environ: Mapping[str, str], *, speaks: bool) -> None:
        """``speaks``: this process posts (rank 0, or the batch shell's helper); on every
        other rank the notifier is silent, so no event is posted twice."""
        self.config = config
        self.job = own_job_id(environ) or "local"
        self.host = socket.gethostname()
        self.sinks: list[Sink] = sinks_for(config.notify) if speaks else []

    def tell(self, event: Event, step: int, detail: str = "") -> None:
        """Send ``event`` in the background, if it is one of those asked for."""
        if not self.sinks or event.value not in self.config.notify.events:
            return
        run = self.config.run
        notice = Notice(event, run.dir, run.name, self.job, step, detail, self.host)
        for sink in self.sinks:
            sink.send(notice)

    def close(self, grace_s: float = LEAVE_GRACE_S) -> None:
        """Before the process leaves: a short grace for posts not yet sent, never for answers."""
        close_all(self.sinks, grace_s)


def shell_tells_failures(environ: Mapping[str, str]) -> bool:
    """Does hpcddp's job script run this rank? Then its batch shell tells failures (it knows
    whether the job is requeued, restarted or ends), and rank 0 must not tell them again.

    The script's mark is the job end it exports, tagged with its own job id.
    """
    job = environ.get("SLURM_JOB_ID", "")
    return bool(job) and environ.get(deadline.JOB_END_VAR, "").startswith(f"{job}@")
