"""When a run stops early and what follows: the job's deadline, the stop vote, the requeue.

`Stopping` holds the decisions `hpcddp.train.loop` asks for at start-up (when to stop ahead of
the job's time limit), after each step (the ranks' vote) and after a stop, and turns a stop
into the typed `RunOutcome`. What follows a stop (requeue a preempted Slurm job, hand on to the
next link of the run's chain, or neither) is decided by `hpcddp.resilience.rules.after_stop`;
this module gathers its facts (the clock, the chain's record) and carries the decision out
(rank 0's ``scontrol requeue``). The NaN policy is not here: it lives whole in
`hpcddp.train.guard`.
"""

import dataclasses
import logging
import pathlib
import time

from hpcddp.comm import collectives
from hpcddp.config import Config
from hpcddp.errors import ConfigError
from hpcddp.launch.distenv import DistEnv
from hpcddp.outcome import RunOutcome, StopReason
from hpcddp.records import attempts, chain_record
from hpcddp.records.rundir import Attempt
from hpcddp.resilience import deadline, requeue, rules
from hpcddp.resilience.rules import Action, ChainPlace, Decision
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
        """After the stop checkpoint: ask the rules what follows, record the attempt (rank 0),
        and carry the decision out."""
        stop = rules.Stopped(
            reason=reason,
            step=step,
            resumed_step=self.resumed_step,
            deadline_passed=self.deadline is not None and time.time() >= self.deadline,
            margin_s=self.cfg.train.stop_before_end_s,
        )
        decision = rules.after_stop(stop)  # every rank alike: the rules that need no record
        if decision.refused:
            raise ConfigError(decision.message)
        if self.env.is_main:  # before requeueing, which ends the job's processes
            self.record_attempt(reason.label, step)
        if decision.action is Action.REQUEUE:  # unless a chain's link hands on: rank 0 reads
            decision = collectives.on_rank_zero(
                lambda: rules.after_stop(stop, self.chain_place()),
                self.env.rank,
                "read the run's chain",
            )
        return self._carry_out(decision, stop)

    def _carry_out(self, decision: Decision, stop: rules.Stopped) -> RunOutcome:
        """Hand on (nothing to do: the next link is queued), requeue (rank 0), or just stop."""
        outcome = RunOutcome(step=stop.step, stop=stop.reason)
        if decision.action is Action.HAND_ON:
            log.info("preempted at step %d, checkpoint saved; %s", stop.step, decision.message)
            return dataclasses.replace(outcome, handed_on=True)
        if decision.action is not Action.REQUEUE:
            return outcome
        requeued, message = collectives.on_rank_zero(
            lambda: requeue.requeue(self.env.environ), self.env.rank, "requeue the job"
        )
        (log.info if requeued else log.error)(
            "preempted at step %d, checkpoint saved; %s", stop.step, message
        )
        return dataclasses.replace(outcome, requeued=requeued)

    def chain_place(self) -> ChainPlace | None:
        """Rank 0: where this job sits in the run's chain (`hpcddp.records.chain_record`);
        None when it is no link of one."""
        found = chain_record.link_of(self.run_dir, requeue.own_job_id(self.env.environ))
        if found is None:
            return None
        chain, where = found
        last = chain.links[-1] if chain.links else ""
        return ChainPlace(chain.name, chain.size, where, len(chain.links), last)

    def record_attempt(self, cause: str, step: int) -> None:
        """Rank 0: this attempt's line in attempts.jsonl (`hpcddp.records.attempts`)."""
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
