"""After a rank died: requeue without its node, or stop, and why; and the attempts it records."""

import json

import pytest

from hpcddp import exit_codes
from hpcddp.slurm import retry
from hpcddp.slurm.retry import Decision, Failure, Situation, decide
from hpcddp.storage import attempts

KILLED = "srun: error: n2: task 3: Killed"


def test_srun_names_the_node_and_task_that_died_first():
    assert Failure.from_srun(137, KILLED) == Failure(137, "n2", "task 3 on n2: Killed", True)
    exited = Failure.from_srun(1, "srun: error: gpu-017: tasks 4-7: Exited with exit code 1")
    assert (exited.node, exited.what) == (
        "gpu-017",
        "tasks 4-7 on gpu-017: Exited with exit code 1",
    )
    unknown = Failure.from_srun(1, "")
    assert (unknown.node, unknown.what) == ("", "the step exited with status 1")


def test_a_first_rank_killed_by_sigabrt_is_a_rank_death_whatever_the_step_s_status():
    """NCCL's watchdog aborts a rank (SIGABRT); a survivor's later exit status 2 must not make
    the failure bad input: the first death decides."""
    aborted = "srun: error: n2: task 1: Aborted (core dumped)"
    for status in (134, 143, exit_codes.USAGE):
        decision = decide(Failure.from_srun(status, aborted), situation())
        assert decision.requeue and decision.exclude == ("n2",), decision.message
    usage = Failure.from_srun(2, "srun: error: n1: task 0: Exited with exit code 2")
    assert not decide(usage, situation()).requeue  # bad input still stops at once


def situation(**changes):
    base = {"job": "12", "max_failures": 2, "earlier": [], "gained": 40, "excluded": ()}
    base.update({"usable": None, "needed": 2}, **changes)
    return Situation(**base)


FAILED_BEFORE = {"cause": "failed: task 1 on n1: Killed", "steps_gained": 10}
PREEMPTED_BEFORE = {"cause": "preempted", "steps_gained": 10}
KILLED_N2 = Failure(137, "n2", "task 3 on n2: Killed")
REQUEUED = "requeueing job 12 without n2 (failure 1 of at most 2; this attempt saved 40 steps)"

RULES = [
    # (id, failure, situation, requeued?, nodes excluded, words of the one line)
    ("first-failure", KILLED_N2, situation(), True, ("n2",), REQUEUED),
    ("keeps-excludes", KILLED_N2, situation(excluded=("n5",)), True, ("n2", "n5"), "without n2,n5"),
    ("node-unknown", Failure(1, "", "x"), situation(), True, (), "requeueing job 12 (failure 1"),
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
        situation(usable=("n1", "n2"), needed=2),
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
    decision = decide(failure, now)
    assert (decision.requeue, decision.exclude) == (requeue, exclude)
    assert words in decision.message and "\n" not in decision.message


def test_what_the_job_script_reads():
    assert Decision(True, ("n2", "n5"), "").as_output() == "requeue n2,n5"
    assert Decision(True, (), "").as_output() == "requeue"
    assert Decision(False, (), "").as_output() == "stop"


def test_the_helper_decides_and_records_the_attempt(tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for name in ("step-00000030.pt", "step-00000030.pt.sha256"):  # what CheckpointStore leaves
        (run_dir / "checkpoints" / name).write_text("x")
    environ = {"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    environ["SLURM_JOB_NUM_NODES"] = "1"
    argv = ["--status", "137", "--srun-error", KILLED, "--usable", "n1 n2 n3"]
    argv += ["--excluded", "(null)", f"run.dir={run_dir}"]
    assert retry.main(argv, environ) == 0
    out, err = capsys.readouterr()
    assert out == "requeue n2\n"
    assert err.startswith("hpcddp: task 3 on n2: Killed; requeueing job 12 without n2")
    (record,) = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert record["cause"] == "failed: task 3 on n2: Killed" and record["excluded"] == ["n2"]
    assert (record["nodes"], record["from_step"], record["step"]) == (["n1", "n2"], 0, 30)
    # the retry dies too, without saving anything new: the fault follows the job
    assert retry.main(argv, {**environ, "SLURM_RESTART_COUNT": "1"}) == 0
    out, err = capsys.readouterr()
    assert out == "stop\n" and "this retry gained no step" in err
    history = attempts.history(run_dir)
    assert [(a["attempt"], a["steps_gained"]) for a in history] == [(1, 30), (2, 0)]


def test_a_config_that_cannot_load_stops_with_its_reason(tmp_path, capsys):
    assert retry.main(["--status", "1", "--config", str(tmp_path / "nope.yaml")], {}) == 0
    out, err = capsys.readouterr()
    assert out == "stop\n" and "cannot read config" in err
