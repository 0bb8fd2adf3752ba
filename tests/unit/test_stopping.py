"""Stop decisions at start-up: a job Slurm reports as ending now is stopping, not too short.

A `scancel` that lands while the run starts makes Slurm report the job's end as now; the run
must then stop as terminated, never be refused as bad input ("ask for more time").
"""

import signal
import time

import pytest

from hpcddp.config import Config
from hpcddp.errors import ConfigError
from hpcddp.launch.distenv import DistEnv
from hpcddp.outcome import StopReason
from hpcddp.records import attempts
from hpcddp.records.rundir import Attempt
from hpcddp.resilience.deadline import JOB_END_VAR
from hpcddp.train import preemption
from hpcddp.train.stopping import Stopping


def stopping(tmp_path, end: float, seen: set[int], grace_s: float = 0.2, rank: int = 0) -> Stopping:
    """Rank 0 of one (or ``rank`` of two), in Slurm job 42 whose end (as its job script exports
    it) is ``end``."""
    environ = {"SLURM_JOB_ID": "42", JOB_END_VAR: f"42@{end:.0f}", "PATH": str(tmp_path)}
    env = DistEnv(rank, rank, rank + 1, rank + 1, 0, 1, "n1", 29500, "slurm", "42", environ=environ)
    flag = preemption.StopFlag()
    flag.seen = set(seen)
    vote = preemption.StopVote("gloo", distributed=False)
    made = Stopping(Config(), env, flag, vote, Attempt(job="42"), tmp_path)
    made.grace_s = grace_s
    return made


def test_a_job_ending_now_without_a_signal_is_refused(tmp_path):
    run = stopping(tmp_path, end=time.time(), seen=set())
    with pytest.raises(ConfigError, match="the job ends in 0 s.*HINT: ask for more time"):
        run.read_deadline()


# Each signal's stop, written out here (not taken from the implementation): scancel's SIGTERM
# must stay cancelled; USR2 requeues; Ctrl-C would only interrupt, but the job's end has come,
# and the time limit outranks it (`StopReason`: the highest reason wins), so it requeues too.
@pytest.mark.parametrize(
    "signum, expected",
    [
        (signal.SIGTERM, StopReason.TERMINATED),
        (signal.SIGUSR2, StopReason.PREEMPTED),
        (signal.SIGINT, StopReason.PREEMPTED),
    ],
)
def test_a_stop_signal_during_start_up_is_a_stop_not_bad_input(tmp_path, signum, expected):
    run = stopping(tmp_path, end=time.time(), seen={signum})
    run.read_deadline()  # no refusal
    assert run.deadline is not None and run.deadline < time.time()  # the vote stops at once
    assert run.reason(step=1, last=False) is None  # the vote is cast after step 1 ...
    assert run.vote.result() == expected  # ... and read after step 2


def test_the_signal_may_come_just_after_slurm_reports_the_end(tmp_path):
    """scancel sets the job's end first, then signals: the refusal waits a moment for it."""
    run = stopping(tmp_path, end=time.time(), seen=set(), grace_s=5.0)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    previous = signal.signal(signal.SIGALRM, lambda *_: run.stop_flag.seen.add(signal.SIGTERM))
    try:
        started = time.monotonic()
        run.read_deadline()
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 4.0


def test_a_job_with_time_reads_its_deadline_without_waiting(tmp_path):
    run = stopping(tmp_path, end=time.time() + 3600, seen=set(), grace_s=30.0)
    run.read_deadline()
    assert run.deadline == pytest.approx(time.time() + 3600 - 120, abs=5)


def test_a_terminated_stop_is_not_requeued(tmp_path):
    outcome = stopping(tmp_path, end=time.time() + 3600, seen=set()).conclude(
        StopReason.TERMINATED, step=3
    )
    assert (outcome.stop, outcome.requeued, outcome.step, outcome.finished) == (
        StopReason.TERMINATED, False, 3, False,
    )  # fmt: skip


def test_a_stop_every_rank_voted_for_is_marked_agreed_on_the_flag(tmp_path):
    """From then on a second Ctrl-C lets the stop finish (`StopFlag.agreed`)."""
    decided = stopping(tmp_path, end=time.time() + 3600, seen={signal.SIGINT})
    assert decided.reason(1, last=False) is None  # the vote is cast after step 1 ...
    assert not decided.stop_flag.agreed
    assert decided.reason(2, last=False) == StopReason.INTERRUPTED  # ... and read after step 2
    assert decided.stop_flag.agreed
    carrying_on = stopping(tmp_path, end=time.time() + 3600, seen=set())
    assert carrying_on.reason(1, last=False) is None
    assert carrying_on.reason(2, last=False) is None
    assert not carrying_on.stop_flag.agreed


def test_only_rank_zero_records_the_stopped_attempt(tmp_path):
    """docs/run-directory.md: only rank 0 writes files (besides each rank's own log)."""
    for rank in (1, 0):
        (tmp_path / f"rank{rank}").mkdir()
        made = stopping(tmp_path / f"rank{rank}", end=time.time() + 3600, seen=set(), rank=rank)
        made.conclude(StopReason.REQUESTED, step=3)
    assert [p.name for p in (tmp_path / "rank1").iterdir()] == []
    assert [r["cause"] for r in attempts.records(tmp_path / "rank0")] == ["requested"]
