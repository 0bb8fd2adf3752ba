"""Stop reasons, the job's end time and requeueing, at Slurm's real edges (PATH, environment)."""

import datetime
import os
import signal
import stat

import pytest

from hpcddp.train import preemption


def fake_tool(tmp_path, name, script):
    """An executable ``name`` on a PATH of its own, standing in for a Slurm client."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(tmp_path)


@pytest.fixture
def only_fakes_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return tmp_path


def test_requeue_outside_slurm_says_so():
    assert preemption.requeue({}) == (False, "not a Slurm job, nothing to requeue")


def test_requeue_without_scontrol_says_why(monkeypatch):
    monkeypatch.setattr(preemption.shutil, "which", lambda name: None)
    ok, why = preemption.requeue({"SLURM_JOB_ID": "12"})
    assert not ok and "scontrol is not on PATH" in why


def test_requeue_asks_for_the_array_task_not_the_whole_array(only_fakes_on_path):
    log = only_fakes_on_path / "calls"
    fake_tool(only_fakes_on_path, "scontrol", f'echo "$@" >> {log}')
    ok, why = preemption.requeue(
        {"SLURM_JOB_ID": "107", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "7"}
    )
    assert ok and why == "job 100_7 requeued"
    assert log.read_text() == "requeue 100_7\n"


def test_refused_requeue_is_reported_not_hidden(only_fakes_on_path):
    fake_tool(
        only_fakes_on_path,
        "scontrol",
        'echo "Requested operation is presently disabled" >&2; exit 1',
    )
    ok, why = preemption.requeue({"SLURM_JOB_ID": "12"})
    assert not ok and why == (
        "scontrol requeue 12 failed: Requested operation is presently disabled"
    )


def test_job_end_time_from_environment_then_squeue(only_fakes_on_path):
    assert preemption.job_end_time({"SLURM_JOB_END_TIME": "1700000000"}) == 1700000000.0
    fake_tool(only_fakes_on_path, "squeue", 'echo "2026-11-21T09:30:00"')
    expected = datetime.datetime(2026, 11, 21, 9, 30).timestamp()
    assert preemption.job_end_time({"SLURM_JOB_ID": "12"}) == expected
    fake_tool(only_fakes_on_path, "squeue", 'echo "N/A"')  # no limit
    assert preemption.job_end_time({"SLURM_JOB_ID": "12"}) is None
    assert preemption.job_end_time({}) is None


@pytest.mark.parametrize(
    "seen, deadline_passed, reason",
    [
        (set(), False, preemption.CARRY_ON),
        (set(), True, preemption.STOP_PREEMPTED),  # the time limit, without any signal
        ({signal.SIGUSR2}, False, preemption.STOP_PREEMPTED),
        ({signal.SIGTERM}, False, preemption.STOP_TERMINATED),  # scancel: stop, never requeue
        ({signal.SIGINT}, False, preemption.STOP_INTERRUPTED),
        ({signal.SIGTERM}, True, preemption.STOP_TERMINATED),  # cancelled near the end: no requeue
        ({signal.SIGTERM, signal.SIGUSR2}, False, preemption.STOP_TERMINATED),
    ],
)
def test_stop_reasons(seen, deadline_passed, reason):
    flag = preemption.StopFlag()
    flag.seen = set(seen)
    deadline = 0.0 if deadline_passed else None
    assert preemption.reason_of(flag, deadline) == reason


def test_a_cancel_outranks_a_preemption_in_the_vote():
    voted = [r for r in preemption.REASON_NAMES if r != preemption.STOP_NONFINITE]
    assert max(voted) == preemption.STOP_TERMINATED


def test_handler_only_sets_a_flag_and_a_second_ctrl_c_insists():
    flag = preemption.StopFlag().install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.seen == {signal.SIGUSR2}
        os.kill(os.getpid(), signal.SIGINT)
        assert flag.seen == {signal.SIGUSR2, signal.SIGINT}
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        flag.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
