"""What every task of a submitted job runs: training, or the pre-flight (picklable callables).

submitit pickles these on the login node and calls them in each task; torch and the rank side
are imported inside ``__call__``, so submitting never imports them.
"""

from typing import Any

from submitit.core.utils import DelayedSubmission

from hpcddp.config import Config
from hpcddp.launch import collector
from hpcddp.outcome import RunOutcome


class TrainTask:
    """What every task of a submitted job runs: the shared trainer on one config (picklable)."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def __call__(self) -> RunOutcome:
        """Train (or resume) on this task's rank; how the run ended (its summary, or why it
        stopped)."""
        with collector.paused():  # until the first step (`hpcddp.launch.collector`)
            from hpcddp.train.trainer import Trainer  # torch is imported in the job, not here

            result = Trainer(config=self.config).fit()
        if result.requeued:
            # Slurm restarts the job and its rerun resumes from the checkpoint. Leaving without
            # a result (submitit writes none on SystemExit) keeps job.result() waiting for it.
            raise SystemExit(0)
        return result

    def checkpoint(self) -> DelayedSubmission:
        """submitit's hook for a signal that arrives outside training: requeue, then resume."""
        return DelayedSubmission(self)

    def __repr__(self) -> str:
        return f"TrainTask(run.dir={self.config.run.dir!r})"


class CheckTask:
    """What every task of a submitted pre-flight runs: `hpcddp check` on one config (picklable).

    Rank 0 prints the table into the job's output; the result is the report and the problems
    (rank 0's), or the number of errors on the other ranks.
    """

    def __init__(self, config: Config, size_mb: float = 16.0) -> None:
        self.config, self.size_mb = config, size_mb

    def __call__(self) -> dict[str, Any]:
        """Run the check on this task's rank (torch is imported here, in the job)."""
        from hpcddp.check.preflight import check
        from hpcddp.check.table import as_text

        outcome = check(self.config, self.size_mb)
        if outcome.report is not None:
            print(as_text(outcome.report, outcome.problems), flush=True)
        problems = [p.line() for p in outcome.problems]
        return {"errors": outcome.errors, "problems": problems, "report": outcome.report}

    def __repr__(self) -> str:
        return f"CheckTask(run.dir={self.config.run.dir!r})"
