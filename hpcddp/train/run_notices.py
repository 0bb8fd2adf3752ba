"""What rank 0 tells the webhooks (``notify.url``, ``notify.slack_url``) as a run goes: the
trainer's side of `hpcddp.notify`, attached to the loop as a hook (`hpcddp.train.hooks`). Every
rank holds one; only rank 0's posts (`Notifier`'s ``speaks``)."""

from hpcddp.config import Config
from hpcddp.errors import NonFiniteError
from hpcddp.launch.distenv import DistEnv
from hpcddp.notify.notices import Notifier, shell_tells_failures
from hpcddp.outcome import RunOutcome, StopReason
from hpcddp.run_events import Event
from hpcddp.train.hooks import Hook
from hpcddp.train.state import Progress


class RunNotices(Hook):
    """started, preempted, nan, completed and failed, as this run's rank 0 sees them."""

    def __init__(self, cfg: Config, env: DistEnv) -> None:
        self.env = env
        self.notifier = Notifier(cfg, env.environ, speaks=env.is_main)

    def started(self, step: int) -> None:
        """Once per attempt, once its checkpoint is loaded: where it runs, where it starts."""
        env = self.env
        start = f"resumed from step {step}" if step else "from the start"
        where = f"{env.world_size} ranks on {env.num_nodes} node(s), {start}"
        self.notifier.tell(Event.STARTED, step, where)

    def stopped(self, reason: StopReason, step: int) -> None:
        """A preempted run, told before its requeue (which ends the job's processes); other
        stops (asked for, Ctrl-C, scancel) are not events."""
        if reason == StopReason.PREEMPTED:
            self.notifier.tell(Event.PREEMPTED, step, "checkpoint saved, requeueing")

    def completed(self, outcome: RunOutcome) -> RunOutcome:
        """A run that trained to the end (summary.json written) is "completed"; the outcome,
        whatever it is, is handed back."""
        if outcome.finished:
            loss = outcome.summary.final_loss if outcome.summary else None
            said = f"final loss {loss:.4g}" if loss else ""
            self.notifier.tell(Event.COMPLETED, outcome.step, said)
        return outcome

    def failed(self, err: BaseException, step: int) -> None:
        """A non-finite stop is "nan"; another error "failed", unless hpcddp's job script runs
        this job: its batch shell tells the failure once it knows what follows (a requeue?)."""
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        if isinstance(err, NonFiniteError):
            self.notifier.tell(Event.NAN, step, first_line)
        elif not shell_tells_failures(self.env.environ):
            self.notifier.tell(Event.FAILED, step, first_line)

    def close(self) -> None:
        """A short grace for posts not yet sent, none for answers."""
        self.notifier.close()

    # -- the loop's moments (`hpcddp.train.hooks.Hook`) ---------------------------------------

    def on_start(self, progress: Progress) -> None:
        self.started(progress.step)

    def on_stop(self, progress: Progress, reason: StopReason) -> None:
        self.stopped(reason, progress.step)

    def on_end(self, outcome: RunOutcome) -> None:
        self.completed(outcome)

    def on_failure(self, err: BaseException, step: int) -> None:
        self.failed(err, step)
