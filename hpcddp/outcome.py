"""How a training run ended, as a typed value every caller reads the same way (torch-free).

The trainer returns a `RunOutcome`; the CLI turns it into an exit status, the submitted task
into "leave for the requeue" or a result, and ``hpcddp status`` into STOPPED. `StopReason` is
also the value the ranks vote with (`hpcddp.train.preemption`): higher wins.
"""

import dataclasses
import enum

from hpcddp.run_files import RunSummary


class StopReason(enum.IntEnum):
    """Why a run stopped before its end; as a vote, the highest reason any rank saw wins."""

    REQUESTED = 1  # train.stop_after_steps
    INTERRUPTED = 2  # Ctrl-C (SIGINT)
    PREEMPTED = 3  # SIGUSR2 or the job's time limit: requeue and resume
    # SIGTERM is what scancel sends: a cancelled job must stay cancelled, so it outranks all
    TERMINATED = 4
    NONFINITE = 5  # never voted: every rank finds it alone at the same step (train/guard.py)

    @property
    def label(self) -> str:
        """The lower-case name written to summary.json and attempts.jsonl."""
        return self.name.lower()


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What `Trainer.fit` returns: finished (with the summary) or stopped (and why)."""

    step: int  # the optimizer steps taken when the run ended
    stop: StopReason | None = None  # None: trained to the end
    requeued: bool = False  # a preempted Slurm job that requeued itself
    handed_on: bool = False  # a chain link stopped at its time limit: the next link resumes
    summary: RunSummary | None = None  # summary.json, if this run wrote or found one

    @property
    def finished(self) -> bool:
        """True when the run trained to its end."""
        return self.stop is None
