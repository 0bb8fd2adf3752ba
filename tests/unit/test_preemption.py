"""Stop reasons, the job's end time and requeueing, at Slurm's real edges (PATH, environment)."""

import os
import signal
import stat

import pytest

from hpcddp.outcome import StopReason
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


@pytest.mark.parametrize(
    "seen, deadline_passed, reason",
    [
        (set(), False, None),
        (set(), True, StopReason.PREEMPTED),  # the time limit, without any signal
        ({signal.SIGUSR2}, False, StopReason.PREEMPTED),
        ({signal.SIGTERM}, False, StopReason.TERMINATED),  # scancel: stop, never requeue
        ({signal.SIGINT}, False, StopReason.INTERRUPTED),
        ({signal.SIGTERM}, True, StopReason.TERMINATED),  # cancelled near the end: no requeue
        ({signal.SIGTERM, signal.SIGUSR2}, False, StopReason.TERMINATED),
    ],
)
def test_stop_reasons(seen, deadline_passed, reason):
    flag = preemption.StopFlag()
    flag.seen = set(seen)
    deadline = 0.0 if deadline_passed else None
    assert preemption.reason_of(flag, deadline) == reason


def test_a_cancel_outranks_a_preemption_in_the_vote():
    voted = [r for r in StopReason if r != StopReason.NONFINITE]
    assert max(voted) == StopReason.TERMINATED


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
