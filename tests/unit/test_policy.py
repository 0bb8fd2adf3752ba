"""What the job script does next: run on which nodes, requeue without which, or stop; why; and
the attempts it records (`hpcddp.slurm.policy`)."""

import dataclasses
import json

import pytest

from hpcddp import exit_codes
from hpcddp.config import load_config
from hpcddp.errors import ConfigError
from hpcddp.records import attempts
from hpcddp.resilience.rules import (
    Action,
    Decision,
    Failure,
    Shrinking,
    Situation,
    after_failure,
    after_step,
    first_hosts,
)
from hpcddp.slurm import policy

KILLED = "srun: error: n2: task 3: Killed"
NODE_STATES = "n1 idle\nn2 mix\nn3 alloc\nn4 down*\n"  # sinfo -h -N -o '%N %t'


def test_srun_names_the_node_and_task_that_died_first():
    assert Failure.from_srun(137, KILLED) == Failure(137, "n2", "task 3 on n2: Killed", True)
    exited = Failure.from_srun(1, "srun: error: gpu-017: tasks 4-7: Exited with exit code 1")
    assert (exited.node, exited.what) == (
        "gpu-017",
        "tasks 4-7 on gpu-017: Exited with exit code 1",
    )
    unknown = Failure.from_srun(1, "")
    assert (unknown.node, unknown.what) == ("", "the step exited with status 1")


def test_a_survivor_that_only_lost_its_peer_is_passed_over_whenever_srun_heard_of_it():
    """srun prints the ends in the order it hears of them: the rank that lost its peer (exit 76)
    can come first; the death is the cause, and its node is the one to leave out."""
    lost = "srun: error: n1: task 0: Exited with exit code 76"
    lines = f"{lost}\nsrun: launch/slurm: _step_signal: Terminating StepId=7.0\n{KILLED}\n"
    assert Failure.from_srun(1, lines) == Failure(1, "n2", "task 3 on n2: Killed", True)
    assert Failure.from_srun(76, lost).node == "n1"  # nothing else said: the survivor's own line
    error_first = f"srun: error: n1: task 0: Exited with exit code 1\n{KILLED}"
    assert Failure.from_srun(1, error_first).what == "task 0 on n1: Exited with exit code 1"


def situation(**changes):
    base = {"job": "12", "max_failures": 2, "earlier": [], "gained": 40, "excluded": ()}
    base.update({"usable": None, "allocation": ("n1", "n2"), "spare_nodes": 0}, **changes)
    return Situation(**base)


def test_a_first_rank_killed_by_sigabrt_is_a_rank_death_whatever_the_step_s_status():
    """NCCL's watchdog aborts a rank (SIGABRT); a survivor's later exit status 2 must not make
    the failure bad input: the first death decides."""
    aborted = "srun: error: n2: task 1: Aborted (core dumped)"
    for status in (134, 143, exit_codes.USAGE):
        decision = after_failure(Failure.from_srun(status, aborted), situation())
        assert decision.action is Action.REQUEUE and decision.exclude == ("n2",), decision.message
    usage = Failure.from_srun(2, "srun: error: n1: task 0: Exited with exit code 2")
    assert after_failure(usage, situation()).action is Action.STOP  # bad input stops at once


FAILED_BEFORE = {"cause": "failed: task 1 on n1: Killed", "steps_gained": 10}
PREEMPTED_BEFORE = {"cause": "preempted", "steps_gained": 10}
KILLED_N2 = Failure(137, "n2", "task 3 on n2: Killed")
REQUEUED = "requeueing job 12 without n2 (failure 1 of at most 2; this attempt saved 40 steps)"

RULES = [
    # (id, failure, situation, requeued?, nodes excluded, words of the one line)
    ("first-failure", KILLED_N2, situation(), True, ("n2",), REQUEUED),
    ("keeps-excludes", KILLED_N2, situation(excluded=("n5",)), True, ("n2", "n5"), "without n2,n5"),
    ("node-unknown", Failure(1, "", "x"), situation(), True, (), "requeueing job 12 (failure 1"),
    (
        "a-rank-that-stopped-for-bad-input-first",
        Failure.from_srun(143, "srun: error: n1: task 0: Exited with exit code 2"),
        situation(),
        False,
        (),
        "bad input fails on every node",
    ),
    ("bad-input", Failure(2, "n2", "x"), situation(), False, (), "bad input fails on every node"),
    ("disabled", KILLED_N2, situation(max_failures=0), False, (), "slurm.max_failures=0"),
    ("too-many", KILLED_N2, situation(earlier=[FAILED_BEFORE] * 2), False, (), "failed 3 times"),
    (
        "retry-without-progress",
        KILLED_N2,
        situation(earlier=[FAILED_BEFORE], gained=0),
        False,
        (),
        "this retry gained no step",
    ),
    (
        "no-progress-after-a-preemption-is-no-retry",
        KILLED_N2,
        situation(earlier=[PREEMPTED_BEFORE], gained=0),
        True,
        ("n2",),
        "failure 1 of",
    ),
    (
        "too-few-nodes-left",
        KILLED_N2,
        situation(usable=("n1", "n2")),
        False,
        (),
        "without n2 the partition has 1 usable node(s) for a job of 2",
    ),
    ("enough-left", KILLED_N2, situation(usable=("n1", "n2", "n3")), True, ("n2",), "without n2"),
]


@pytest.mark.parametrize(
    "failure, now, requeue, exclude, words", [r[1:] for r in RULES], ids=[r[0] for r in RULES]
)
def test_the_rules_in_order(failure, now, requeue, exclude, words):
    decision = after_failure(failure, now)
    assert (decision.action is Action.REQUEUE, decision.exclude) == (requeue, exclude)
    assert words in decision.message and "\n" not in decision.message


def test_what_the_job_script_reads():
    assert Decision(Action.REQUEUE, status=137, exclude=("n2", "n5")).as_output() == (
        "requeue 137 n2,n5"
    )
    assert Decision(Action.REQUEUE, status=75).as_output() == "requeue 75"
    assert Decision(Action.STOP, status=2).as_output() == "stop 2"
    assert Decision(Action.RUN).as_output() == "run all"
    assert Decision(Action.RUN, hosts=("n1", "n3"), avoid=("n2",)).as_output() == "run n1,n3 n2"


def test_the_helper_decides_and_records_the_attempt(tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for name in ("step-00000030.pt", "step-00000030.pt.sha256"):  # what CheckpointStore leaves
        (run_dir / "checkpoints" / name).write_text("x")
    environ = {"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    environ["SLURM_JOB_NUM_NODES"] = "1"
    argv = ["after", "--status", "137", "--srun-errors", KILLED, "--node-states", NODE_STATES]
    argv += ["--excluded", "(null)", f"run.dir={run_dir}"]
    assert policy.main(argv, environ) == 0
    out, err = capsys.readouterr()
    assert out == "requeue 137 n2\n"
    assert err.startswith("hpcddp: task 3 on n2: Killed; requeueing job 12 without n2")
    (record,) = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert record["cause"] == "failed: task 3 on n2: Killed" and record["excluded"] == ["n2"]
    assert record["then"] == "requeue"
    assert (record["nodes"], record["from_step"], record["step"]) == (["n1", "n2"], 0, 30)
    # the retry dies too, without saving anything new: the fault follows the job
    assert policy.main(argv, {**environ, "SLURM_RESTART_COUNT": "1"}) == 0
    out, err = capsys.readouterr()
    assert out == "stop 137\n" and "this retry gained no step" in err
    history = attempts.history(run_dir)
    assert [(a["attempt"], a["steps_gained"]) for a in history] == [(1, 30), (2, 0)]


def test_a_config_that_cannot_load_stops_with_its_reason(tmp_path, capsys):
    argv = ["after", "--status", "1", "--config", str(tmp_path / "nope.yaml")]
    assert policy.main(argv, {}) == 0
    out, err = capsys.readouterr()
    assert out == "stop 1\n" and "cannot read config" in err


# -- spare nodes: restart inside the job ------------------------------------------------------

THREE = ("n1", "n2", "n3")


def test_the_first_step_runs_on_the_first_nodes_and_keeps_the_last_in_reserve():
    assert first_hosts(THREE, 1) == Decision(Action.RUN, hosts=("n1", "n2"))
    assert first_hosts(THREE, 0).as_output() == "run all"  # srun's own geometry, as without
    refused = first_hosts(("n1",), 1)
    assert refused.action is Action.STOP and refused.status == 2
    assert "none left to train on beside slurm.spare_nodes=1" in refused.message


def test_a_rank_death_restarts_on_the_healthy_nodes_plus_a_spare():
    now = situation(allocation=THREE, spare_nodes=1)
    decision = after_failure(KILLED_N2, now)
    assert decision.as_output() == "run n1,n3 n2"  # n2 left out, n3 takes its place
    assert "restarting in job 12 on n1,n3 without n2 (failure 1 of at most 2" in decision.message


def test_with_no_spare_left_the_job_is_requeued_without_every_failed_node():
    now = situation(allocation=THREE, spare_nodes=1, avoid=("n2",), earlier=[FAILED_BEFORE])
    killed_n3 = Failure(137, "n3", "task 1 on n3: Killed")
    decision = after_failure(killed_n3, now)
    assert decision.action is Action.REQUEUE and decision.exclude == ("n2", "n3")


@pytest.mark.parametrize(
    "failure, now, words",
    [
        (Failure(2, "n2", "x"), situation(spare_nodes=1), "bad input"),
        (KILLED_N2, situation(spare_nodes=1, max_failures=0), "slurm.max_failures=0"),
        (
            KILLED_N2,
            situation(spare_nodes=1, earlier=[FAILED_BEFORE] * 2),
            "failed 3 times",
        ),
    ],
)
def test_spares_do_not_lift_the_limits(failure, now, words):
    now = dataclasses.replace(now, allocation=THREE)
    decision = after_failure(failure, now)
    assert decision.action is Action.STOP and words in decision.message


def test_a_success_a_scancel_and_a_check_are_never_retried():
    now = situation(spare_nodes=1, allocation=THREE)
    assert after_step(Failure(0), now, terminated=False, training=True).as_output() == "stop 0"
    assert after_step(KILLED_N2, now, terminated=True, training=True).action is Action.STOP
    assert after_step(KILLED_N2, now, terminated=False, training=False).action is Action.STOP


def test_the_helper_restarts_and_records_the_attempt(tmp_path, capsys):
    run_dir = tmp_path / "run"
    environ = {"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "n[1-3]"}
    common = [f"run.dir={run_dir}", "slurm.spare_nodes=1"]
    assert policy.main(["first", *common], environ) == 0
    assert capsys.readouterr().out == "run n1,n2\n"
    argv = ["after", "--status", "137", "--srun-errors", KILLED, "--hosts", "n1,n2", *common]
    assert policy.main(argv, environ) == 0
    out, err = capsys.readouterr()
    assert out == "run n1,n3 n2\n" and "restarting in job 12 on n1,n3 without n2" in err
    (record,) = attempts.history(run_dir)
    assert (record["nodes"], record["excluded"], record["then"]) == (
        ["n1", "n2"],
        ["n2"],
        "restart",
    )


def test_the_helper_reads_sinfo_s_lines_for_the_nodes_a_requeue_could_use(tmp_path, capsys):
    """n2 died and n3 is down: the partition has one usable node left for a job of two."""
    environ = {"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    states = "n1 idle\nn2 mix\nn3 down*\n"
    argv = ["after", "--status", "137", "--srun-errors", KILLED, "--node-states", states]
    assert policy.main([*argv, f"run.dir={tmp_path}"], environ) == 0
    out, err = capsys.readouterr()
    assert out == "stop 137\n" and "the partition has 1 usable node(s) for a job of 2" in err


# -- shrinking: no spare left, go on with the nodes that remain ---------------------------------

ONE_UP = Shrinking(min_nodes=1)
KILLED_N3 = Failure(137, "n3", "task 1 on n3: Killed")
SPARE_USED = {"spare_nodes": 1, "avoid": ("n2",), "earlier": [FAILED_BEFORE]}

# (id, failure, situation, what the job script reads, words of the one line)
SHRINK = [
    ("shrinks-to-the-survivor", KILLED_N2, situation(shrinking=ONE_UP), "run n1 n2", "from 2 to 1"),
    ("off-requeues", KILLED_N2, situation(), "requeue 137 n2", "requeueing job 12"),
    ("floor-defaults-to-all", KILLED_N2, situation(shrinking=Shrinking()), "requeue 137 n2", ""),
    (
        "below-the-floor-requeues",
        KILLED_N2,
        situation(allocation=THREE, shrinking=Shrinking(3)),
        "requeue 137 n2",
        "requeueing job 12",
    ),
    (
        "at-the-floor-shrinks",
        KILLED_N2,
        situation(allocation=THREE, shrinking=Shrinking(2)),
        "run n1,n3 n2",
        "shrinking from 3 to 2 node(s) (slurm.min_nodes=2): restarting in job 12 on n1,n3",
    ),
    (
        "a-spare-comes-first",
        KILLED_N2,
        situation(allocation=THREE, spare_nodes=1, shrinking=ONE_UP),
        "run n1,n3 n2",
        "restarting in job 12 on n1,n3 without n2",
    ),
    (
        "after-the-spare-shrinks",
        KILLED_N3,
        situation(allocation=THREE, shrinking=ONE_UP, **SPARE_USED),
        "run n1 n2,n3",
        "shrinking from 2 to 1 node(s)",
    ),
    (
        "an-unknown-node-requeues",
        Failure(137, "", "the step exited with status 137"),
        situation(shrinking=ONE_UP),
        "requeue 137",
        "requeueing job 12",
    ),
    ("limits-still-hold", KILLED_N2, situation(shrinking=ONE_UP, max_failures=0), "stop 137", ""),
]


@pytest.mark.parametrize(
    "failure, now, said, words", [r[1:] for r in SHRINK], ids=[r[0] for r in SHRINK]
)
def test_with_no_spare_left_a_run_shrinks_down_to_its_floor(failure, now, said, words):
    decision = after_failure(failure, now)
    assert decision.as_output() == said, decision.message
    assert words in decision.message
    assert ("shrinking" in decision.message) == bool(decision.shrank)


def test_the_helper_records_how_far_the_job_shrank(tmp_path, capsys):
    run_dir = tmp_path / "run"
    environ = {"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "n[1-2]"}
    common = [f"run.dir={run_dir}", "slurm.nodes=2", "slurm.shrink_on_failure=true"]
    argv = ["after", "--status", "137", "--srun-errors", KILLED, *common, "slurm.min_nodes=1"]
    assert policy.main(argv, environ) == 0
    out, err = capsys.readouterr()
    assert out == "run n1 n2\n" and "shrinking from 2 to 1 node(s)" in err
    (record,) = attempts.history(run_dir)
    assert (record["then"], record["shrank"]) == ("restart", {"from_nodes": 2, "to_nodes": 1})
    # the floor left at its default (all of slurm.nodes): today's requeue, nothing shrank
    assert policy.main([*argv[:-1], f"run.dir={tmp_path / 'run2'}"], environ) == 0
    assert capsys.readouterr().out == "requeue 137 n2\n"
    assert "shrank" not in attempts.history(tmp_path / "run2")[0]


@pytest.mark.parametrize("floor, words", [(3, "above slurm.nodes=2"), (-1, "slurm.min_nodes")])
def test_a_floor_outside_the_job_is_refused_with_a_hint(floor, words):
    with pytest.raises(ConfigError, match="HINT") as refused:
        load_config(None, ["slurm.nodes=2", f"slurm.min_nodes={floor}"])
    assert words in str(refused.value)
