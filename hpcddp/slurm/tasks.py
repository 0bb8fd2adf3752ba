"""What every task of a submitted job runs: training, or the pre-flight (picklable callables).

submitit pickles these on the login node and calls them in each task; torch and the rank side
are imported inside ``__call__``, so submitting never imports them.
"""

import os
from typing import Any

import submitit
from submitit.core.utils import DelayedSubmission

from hpcddp import exit_codes
from hpcddp.config import Config
from hpcddp.errors import ConfigError
from hpcddp.launch import collector
from hpcddp.outcome import RunOutcome, StopReason
from hpcddp.resilience import rules
from hpcddp.run_files import read_summary
from hpcddp.slurm import chain


class TrainTask:
    """What every task of a submitted job runs: the shared trainer on one config (picklable)."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def __call__(self) -> RunOutcome:
        """Train (or resume) on this task's rank; how the run ended (its summary, or why it
        stopped)."""
        link = ChainLink(self.config) if self.config.slurm.chained else None
        if link is not None and link.run_ended():
            return link.summary_outcome()  # the run ended before this link started: leave
        try:
            with collector.paused():  # until the first step (`hpcddp.launch.collector`)
                from hpcddp.train.trainer import Trainer  # torch is imported in the job, not here

                result = Trainer(config=self.config).fit()
        except ConfigError:
            if link is not None:
                link.ended(exit_codes.USAGE)  # bad input: every later link would fail alike
            raise
        if result.requeued:
            # The rules requeued the job (`hpcddp.resilience.rules.after_stop`) and rank 0 did:
            # Slurm restarts it and its rerun resumes from the checkpoint. Leaving without a
            # result (submitit writes none on SystemExit) keeps job.result() waiting for it.
            raise SystemExit(0)
        if link is not None:
            link.ended(exit_codes.OK, terminated=result.stop == StopReason.TERMINATED)
        return result

    def checkpoint(self) -> DelayedSubmission | None:
        """submitit's hook for a signal that arrives outside training: it carries out
        `hpcddp.resilience.rules.outside_training` (a requeue is this task resubmitted; a
        chain's link hands on: None, its next link resumes)."""
        decision = rules.outside_training(chained=self.config.slurm.chained)
        return DelayedSubmission(self) if decision.action is rules.Action.REQUEUE else None

    def __repr__(self) -> str:
        return f"TrainTask(run.dir={self.config.run.dir!r})"


class ChainLink:
    """A submitted task's part in its run's chain: task 0 cancels the links left once the
    run ended for good (`hpcddp.slurm.chain`; submitit's job has no batch shell of ours)."""

    def __init__(self, config: Config) -> None:
        self.run_dir = config.run.dir
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        self.rank = submitit.JobEnvironment().global_rank

    def run_ended(self) -> bool:
        """True when the run ended before this link started; task 0 then cancels the rest."""
        rest, why = chain.ended_before(self.run_dir, self.job_id)
        self._cancel(rest, why)
        return bool(why)

    def ended(self, status: int, *, terminated: bool = False) -> None:
        """After training: task 0 cancels the links left if the run ended for good."""
        rest, why = chain.rest_to_cancel(self.run_dir, self.job_id, status, terminated=terminated)
        self._cancel(rest, why)

    def summary_outcome(self) -> RunOutcome:
        """The ended run's outcome, from its summary."""
        summary = read_summary(self.run_dir)
        return RunOutcome(step=summary.steps if summary else 0, summary=summary)

    def _cancel(self, rest: tuple[str, ...], why: str) -> None:
        if why and self.rank == 0:
            print(f"hpcddp: {why}; {chain.cancel(rest) or 'no links left'}", flush=True)


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
        from hpcddp.train.model_size import measure

        outcome = check(self.config, self.size_mb, measure_model=lambda: measure(self.config))
        if outcome.report is not None:
            print(as_text(outcome.report, outcome.problems), flush=True)
        problems = [p.line() for p in outcome.problems]
        return {"errors": outcome.errors, "problems": problems, "report": outcome.report}

    def __repr__(self) -> str:
        return f"CheckTask(run.dir={self.config.run.dir!r})"
