"""How a run ends, as a table (`hpcddp.resilience.rules`): after a stop, outside training,
between two steps, which node states a requeued job may land on; and the job script's quick
question, answered without torch or a config. The rules after a rank's death are in
test_policy.py, the cancelling of a chain's links in test_chain.py."""

import subprocess
import sys
import time

import pytest

from hpcddp import exit_codes
from hpcddp.config import Config
from hpcddp.errors import ConfigError
from hpcddp.launch.distenv import DistEnv
from hpcddp.outcome import StopReason
from hpcddp.records import attempts
from hpcddp.records.rundir import Attempt
from hpcddp.resilience import rules
from hpcddp.resilience.rules import Action, ChainPlace, Stopped
from hpcddp.train import preemption
from hpcddp.train.stopping import Stopping

PREEMPTED = Stopped(
    StopReason.PREEMPTED, step=40, resumed_step=10, deadline_passed=True, margin_s=120
)
MIDDLE = ChainPlace("c", size=4, where=2, submitted=4, last_job="14")
LAST = ChainPlace("c", size=4, where=4, submitted=4, last_job="14")


def stopped(**changes) -> Stopped:
    fields = {**PREEMPTED.__dict__, **changes}
    return Stopped(**fields)


# -- after a step ended, before any failure rule ---------------------------------------------

NOW = rules.Situation("12", 2, [], 40, (), None, ("n1", "n2"), 0)

# (id, exit status, terminated, training, action, the job's status): a step that stopped to be
# requeued but had no scontrol (exit 75, a container) is requeued by the shell, as no failure;
# scancel's
# SIGTERM or a step that was not training ends the job whatever the status
AFTER_STEP = [
    ("finished", exit_codes.OK, False, True, Action.STOP, 0),
    ("no-scontrol-requeues", exit_codes.STOPPED_NOT_REQUEUED, False, True, Action.REQUEUE, 75),
    ("scancel-ends-it", exit_codes.STOPPED_NOT_REQUEUED, True, True, Action.STOP, 75),
    ("killed-but-cancelled", 137, True, True, Action.STOP, 137),
    ("not-training", 137, False, False, Action.STOP, 137),
]


@pytest.mark.parametrize(
    "status, terminated, training, action, job_status",
    [r[1:] for r in AFTER_STEP],
    ids=[r[0] for r in AFTER_STEP],
)
def test_after_a_step(status, terminated, training, action, job_status):
    failure = rules.Failure(status, "n2", "task 1 on n2: Exited")
    decision = rules.after_step(failure, NOW, terminated=terminated, training=training)
    # none of them is a node's failure: no node is left out
    assert (decision.action, decision.status, decision.exclude) == (action, job_status, ())


# -- after a stop -------------------------------------------------------------------------------

# (id, the stop, the chain place, the action, words of its message)
AFTER_STOP = [
    ("preempted-requeues", PREEMPTED, None, Action.REQUEUE, ""),
    ("in-time-requeues", stopped(deadline_passed=False), None, Action.REQUEUE, ""),
    ("a-link-hands-on", PREEMPTED, MIDDLE, Action.HAND_ON, "link 2 of 4 of chain c ends"),
    ("the-last-link", PREEMPTED, LAST, Action.HAND_ON, "job 14 is the last link (4 of 4)"),
    ("requested-stops", stopped(reason=StopReason.REQUESTED), MIDDLE, Action.STOP, ""),
    ("ctrl-c-stops", stopped(reason=StopReason.INTERRUPTED), None, Action.STOP, ""),
    ("scancel-stops", stopped(reason=StopReason.TERMINATED), MIDDLE, Action.STOP, ""),
    ("nan-stops", stopped(reason=StopReason.NONFINITE), None, Action.STOP, ""),
    # the stop time passed within the attempt's first step: a requeue would gain one step
    ("one-step-refused", stopped(step=11), None, Action.STOP, "would gain one step"),
    ("no-step-refused", stopped(step=10), MIDDLE, Action.STOP, "would gain one step"),
    ("two-steps-requeue", stopped(step=12), None, Action.REQUEUE, ""),
    ("one-step-in-time", stopped(step=11, deadline_passed=False), None, Action.REQUEUE, ""),
]


@pytest.mark.parametrize(
    "stop, link, action, words", [r[1:] for r in AFTER_STOP], ids=[r[0] for r in AFTER_STOP]
)
def test_after_a_stop(stop, link, action, words):
    decision = rules.after_stop(stop, link)
    assert decision.action is action
    assert words in decision.message and bool(decision.message) == bool(words)
    assert decision.refused == ("would gain" in words)


def test_the_refusal_names_the_margin_and_the_fix():
    decision = rules.after_stop(stopped(step=11, margin_s=300))
    assert decision.status == exit_codes.USAGE
    assert "train.stop_before_end_s=300 s" in decision.message and "HINT: ask for more time" in (
        decision.message
    )


def test_the_last_link_says_how_to_go_on():
    assert "HINT: submit the same command again" in rules.after_stop(PREEMPTED, LAST).message
    assert "HINT" not in rules.after_stop(PREEMPTED, MIDDLE).message


def stopping(tmp_path, deadline: float) -> Stopping:
    """Rank 0 of one in Slurm job 42, with no scontrol on PATH, resumed at step 10."""
    environ = {"SLURM_JOB_ID": "42", "PATH": str(tmp_path)}
    env = DistEnv(0, 0, 1, 1, 0, 1, "n1", 29500, "slurm", "42", environ=environ)
    vote = preemption.StopVote("gloo", distributed=False)
    run = Stopping(Config(), env, preemption.StopFlag(), vote, Attempt(job="42"), tmp_path)
    run.deadline, run.resumed_step = deadline, 10
    return run


def test_the_trainer_raises_the_refusal_before_recording_the_attempt(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: no real job is ever requeued
    with pytest.raises(ConfigError, match="would gain one step per attempt"):
        stopping(tmp_path, time.time() - 1).conclude(StopReason.PREEMPTED, step=11)
    assert attempts.records(tmp_path) == []
    outcome = stopping(tmp_path, time.time() - 1).conclude(StopReason.PREEMPTED, step=12)
    assert (outcome.stop, outcome.requeued, outcome.handed_on) == (
        StopReason.PREEMPTED,
        False,  # it tried: no scontrol here
        False,
    )
    assert [r["cause"] for r in attempts.records(tmp_path)] == ["preempted"]


@pytest.mark.parametrize("chained, action", [(False, Action.REQUEUE), (True, Action.HAND_ON)])
def test_a_signal_outside_training(chained, action):
    assert rules.outside_training(chained=chained).action is action


# -- between two steps --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "signals, action",
    [
        (["TERM"], Action.STOP),
        (["USR2", "TERM"], Action.STOP),
        (["SIGTERM"], Action.STOP),
        (["USR2"], Action.RUN),  # the next step reads the job's end itself
        ([], Action.RUN),
    ],
)
def test_a_signal_between_steps(signals, action):
    decision = rules.between_steps(signals, status=137)
    assert decision.action is action
    if action is Action.STOP:
        assert decision.as_output() == "stop 137"  # the last step's status is the job's


SINFO = """n1 idle
n2 mix
n3 alloc
n4 comp
n5 idle*
n1 idle
n6 down*
n7 drain
n8 drng
n9 fail
n10 maint
n11 unk*
n12 resv
"""


def test_usable_node_states():
    assert rules.usable_nodes(SINFO.splitlines()) == ("n1", "n2", "n3", "n4", "n5")


def test_a_partition_with_no_node_up_is_unknown_not_empty():
    """None lets the requeue go ahead (it waits for nodes); () would stop the job."""
    assert rules.usable_nodes(["n6 down*", "n7 drain"]) is None
    assert rules.usable_nodes([]) is None


def test_the_shell_s_question_is_answered_without_torch_or_a_config():
    code = (
        "import sys; from hpcddp.resilience.__main__ import main; main(sys.argv[1:]); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'yaml')))"
    )
    for signals, said in ((["TERM"], "stop 137"), (["USR2"], "run")):
        done = subprocess.run(
            [sys.executable, "-c", code, "between-steps", "--status", "137", *signals],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert done.stdout.splitlines() == [said, "[]"]
