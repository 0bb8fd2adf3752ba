"""When a run stops early and what follows: the job's deadline, the stop vote, the requeue.

`Stopping` holds the decisions `hpcddp.train.loop` asks for at start-up (when to stop ahead of
the job's time limit), after each step (the ranks' vote) and after a stop (requeue a preempted
Slurm job, hand on to the next link of the run's chain, or neither), and turns a stop into the
typed `RunOutcome`. The NaN policy is not here: it lives whole in `hpcddp.train.guard`.
"""

import dataclasses
import logging
import pathlib
import time

from hpcddp.comm import collectives
from hpcddp.config import Config
from hpcddp.errors import ConfigError
from hpcddp.launch import deadline, requeue
from hpcddp.launch.distenv import DistEnv
from hpcddp.outcome import RunOutcome, StopReason
from hpcddp.storage import attempts, chain_record
from hpcddp.storage.rundir import Attempt
from hpcddp.train import preemption

log = logging.getLogger(__name__)

# How long rank 0 waits for the stop signal of a job that Slurm already reports as ending:
# `scancel` first sets the job's end to now, then signals its tasks.
SIGNAL_GRACE_S = 5.0


class Stopping:
    """One rank's stop decisions; every rank reaches the same ones at the same step."""

    grace_s = SIGNAL_GRACE_S  # a test may shorten it on its instance

    def __init__(
        self,
        cfg: Config,
        env: DistEnv,
        stop_flag: preemption.StopFlag,
        vote: preemption.StopVote,
        attempt: Attempt,
        run_dir: pathlib.Path,
    ) -> None:
        self.cfg, self.env, self.stop_flag, self.vote = cfg, env, stop_flag, vote
        self.attempt, self.run_dir = attempt, run_dir
        self.deadline: float | None = None  # when to stop ahead of the job's time limit
        self.resumed_step = 0  # where this attempt started
        self.started: dict[str, float] = {}  # this attempt's start times, for recovery

    # -- at start-up --------------------------------------------------------------------------

    def read_deadline(self) -> None:
        """When to stop on our own, ahead of the job's time limit (rank 0 asks Slurm).

        A job whose time cannot hold the stop margin is refused: it would requeue forever.
        """
        margin = self.cfg.train.stop_before_end_s
        end = collectives.on_rank_zero(
            lambda: self.job_end(margin), self.env.rank, "read the job's end time"
        )
        self.deadline = None if end is None else end - margin

    def job_end(self, margin: float) -> float | None:
        """The job's end; refused when it cannot hold ``margin``, unless the job is stopping.

        A `scancel` (or any stop signal) that lands while the run starts makes Slurm report the
        job's end as now: that run is stopped, not given too little time.
        """
        end = deadline.job_end_time(self.env.environ)
        try:
            deadline.check_time_fits(end, margin, time.time())
        except ConfigError:
            if not self._signalled_within(self.grace_s):
                raise
            log.info("a stop signal came while the run started: stopping")
        return end

    def _signalled_within(self, grace_s: float) -> bool:
        until = time.monotonic() + grace_s
        while not self.stop_flag.seen and time.monotonic() < until:
            time.sleep(0.05)
        return bool(self.stop_flag.seen)

    # -- after each step ----------------------------------------------------------------------

    def reason(self, step: int, last: bool) -> StopReason | None:
        """Read the vote cast after the previous step, then cast one if due (no waiting)."""
        agreed = self.vote.result()
        if last:
            return None
        stop_after = self.cfg.train.stop_after_steps
        if not agreed and stop_after and step >= stop_after:
            log.info("stopping after step %d as asked (train.stop_after_steps)", step)
            agreed = StopReason.REQUESTED  # every rank knows this without a vote
        if agreed:
            self.stop_flag.agreed = True  # a second Ctrl-C no longer cuts this stop short
            return agreed
        if self.vote.due(step):
            self.vote.cast(preemption.reason_of(self.stop_flag, self.deadline), step)
        return None

    # -- after a stop -------------------------------------------------------------------------

    def conclude(self, reason: StopReason, step: int) -> RunOutcome:
        """After the stop checkpoint: requeue a preempted Slurm job (rank 0), and say so."""
        preempted = reason == StopReason.PREEMPTED
        if preempted:
            self._refuse_endless_requeue(step)
        if self.env.is_main:  # before requeueing, which ends the job's processes
            self.record_attempt(reason.label, step)
        if not preempted:
            return RunOutcome(step=step, stop=reason)
        link = collectives.on_rank_zero(self.chain_link, self.env.rank, "read the run's chain")
        if link:
            log.info("preempted at step %d, checkpoint saved; %s", step, link)
            return RunOutcome(step=step, stop=reason, handed_on=True)
        requeued, message = collectives.on_rank_zero(
            lambda: requeue.requeue(self.env.environ), self.env.rank, "requeue the job"
        )
        (log.info if requeued else log.error)(
            "preempted at step %d, checkpoint saved; %s", step, message
        )
        return RunOutcome(step=step, stop=reason, requeued=requeued)

    def chain_link(self) -> str:
        """Rank 0: how this job hands on, when it is a link of the run's chain ("" if not).

        A chain's next link waits for this job to end (--dependency=singleton) and resumes
        from the checkpoint, so the job must end, not requeue: a requeued job would wait in the
        queue before that link and run again.
        """
        found = chain_record.link_of(self.run_dir, requeue.own_job_id(self.env.environ))
        if found is None:
            return ""
        chain, where = found
        if where == len(chain.links):
            return (
                f"job {chain.links[-1]} is the last link ({where} of {chain.size}) of chain "
                f"{chain.name}, not requeued. HINT: submit the same command again to resume."
            )
        return f"link {where} of {chain.size} of chain {chain.name} ends; the next link resumes"

    def record_attempt(self, cause: str, step: int) -> None:
        """Rank 0: this attempt's line in attempts.jsonl (`hpcddp.storage.attempts`)."""
        a, size = self.attempt, self._size()
        ended = attempts.Ended(a.job, a.restart, list(a.nodes), cause, step, self.resumed_step)
        attempts.record(self.run_dir, dataclasses.replace(ended, times=self.started, size=size))

    def record_start(self) -> None:
        """Rank 0, after the attempt's first step: its start times, to starts.jsonl, so that
        `hpcddp status` shows a recovery at once and `hpcddp report` knows when an attempt
        that dies later began."""
        self.started["first_step"] = round(time.time(), 3)
        a = self.attempt
        try:
            attempts.record_start(
                self.run_dir, job=a.job, restart=a.restart, times=self.started, size=self._size()
            )
        except OSError as err:  # a timing record is not worth the run
            log.warning("could not record this attempt's start times: %s", err)

    def _size(self) -> dict[str, int]:
        """What this attempt holds, for its cost: GPUs, and the job's nodes (spares too)."""
        a = self.attempt
        return {"gpus": a.gpus, "allocated_nodes": a.allocated_nodes or len(a.nodes)}

    def _refuse_endless_requeue(self, step: int) -> None:
        """The stop time passed within the attempt's first step: a requeue would gain one step."""
        passed = self.deadline is not None and time.time() >= self.deadline
        if passed and step - self.resumed_step <= 1:
            raise ConfigError(deadline.no_room_message(self.cfg.train.stop_before_end_s))
