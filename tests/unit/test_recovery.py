"""Recovery on the record: a failure's detection and end, the next attempt's start, load and first
step (`hpcddp.records.attempts`); the job script's helper naming a hung node from the watchdog's
verdict, not from whichever rank srun saw exit; `hpcddp status` showing the last recovery."""

import json

from hpcddp import exit_codes
from hpcddp.records import attempts
from hpcddp.slurm import policy
from hpcddp.slurm import status as job_status
from tests.unit.test_submission import fake_run, make_record

FAILED_AT = 1_700_000_000.0  # in the past: the restart's lines are written now


def fail_then_restart(run_dir, detected: float | None = FAILED_AT) -> None:
    """Attempt 0 failed (its helper wrote the line); attempt 1 started and stepped."""
    run_dir.mkdir(parents=True, exist_ok=True)
    times = {"detected": detected} if detected is not None else None
    hung = "failed: rank 1 on n1: hung"
    ended = attempts.Ended("5", 0, ["n1"], hung, step=40, from_step=0, excluded=["n1"], times=times)
    attempts.record(run_dir, ended)
    lines = (run_dir / attempts.FILE).read_text().splitlines()
    failure = {**json.loads(lines[0]), "time": FAILED_AT + 2.0}  # all ranks gone 2 s later
    (run_dir / attempts.FILE).write_text(json.dumps(failure) + "\n")
    attempts.record_start(run_dir, job="5", restart=1, times={
        "started": FAILED_AT + 130.0, "loaded": FAILED_AT + 134.5, "first_step": FAILED_AT + 135.0,
    })  # fmt: skip


def test_the_last_recovery_pairs_the_failure_with_the_start_after_it(tmp_path):
    fail_then_restart(tmp_path)
    recovery = attempts.last_recovery(tmp_path)
    assert recovery == attempts.Recovery(
        "failed: rank 1 on n1: hung", FAILED_AT, FAILED_AT + 2.0, FAILED_AT + 130.0,
        FAILED_AT + 134.5, FAILED_AT + 135.0,
    )  # fmt: skip
    line = recovery.as_line()
    assert line.startswith("failed: rank 1 on n1: hung; detected ")
    assert line.endswith("ranks gone +2.0 s, started +130.0 s, checkpoint loaded +134.5 s, "
                         "first step +135.0 s")  # fmt: skip


def test_a_death_is_detected_when_its_step_ends_and_a_restart_not_yet_stepped_shows_dashes(
    tmp_path,
):
    tmp_path.mkdir(exist_ok=True)
    killed = "failed: task 3 on n1: Killed"
    ended = attempts.Ended(job="5", restart=0, nodes=["n1"], cause=killed, step=40, from_step=0)
    attempts.record(tmp_path, ended)
    recovery = attempts.last_recovery(tmp_path)
    assert recovery is not None and recovery.detected == recovery.gone
    assert recovery.as_line().endswith("ranks gone +0.0 s, started -, checkpoint loaded -, "
                                       "first step -")  # fmt: skip
    assert attempts.last_recovery(tmp_path / "nothing") is None


def test_start_lines_are_not_attempts(tmp_path):
    fail_then_restart(tmp_path)
    assert len(attempts.records(tmp_path)) == 1 and attempts.last_step(tmp_path) == 40
    assert len((tmp_path / attempts.FILE).read_text().splitlines()) == 1
    assert [a["cause"] for a in attempts.history(tmp_path)] == ["failed: rank 1 on n1: hung"]


def test_the_helper_excludes_the_hung_node_from_the_verdict_and_records_its_detection(
    tmp_path, capsys
):
    """A rank too stuck to end itself is ended by another, on another node, which srun names:
    the verdict's node is the one to leave out."""
    run_dir = tmp_path / "run"
    verdict_dir = attempts.hang_dir(run_dir, "12", 0)
    verdict_dir.mkdir(parents=True)
    verdict = {"ranks": [3], "hosts": ["n2"], "silent": [3], "detected": FAILED_AT}
    (verdict_dir / "verdict.json").write_text(json.dumps(verdict))
    environ = {"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "n[1-2]",
               "SLURM_JOB_NUM_NODES": "1"}  # fmt: skip
    srun_saw = f"srun: error: n1: task 0: Exited with exit code {exit_codes.HUNG}"
    argv = ["after", "--status", str(exit_codes.HUNG), "--srun-errors", srun_saw,
            "--node-states", "n1 idle\nn2 mix\nn3 idle", "--excluded", "(null)",
            f"run.dir={run_dir}"]  # fmt: skip
    assert policy.main(argv, environ) == 0
    out, err = capsys.readouterr()
    assert out == f"requeue {exit_codes.HUNG} n2\n"
    assert err.startswith("hpcddp: rank 3 on n2: hung; requeueing job 12 without n2")
    (record,) = attempts.records(run_dir)
    assert record["detected"] == FAILED_AT and record["cause"] == "failed: rank 3 on n2: hung"
    # the verdict is taken once: a later death in the same job is not blamed on this hang
    assert attempts.take_hang_verdict(run_dir, "12", 0) is None


def test_status_shows_the_last_recovery(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCDDP_JOBS_DIR", str(tmp_path / "jobs"))
    record = make_record(tmp_path)
    fail_then_restart(tmp_path / "run")
    forgotten = fake_run({"scontrol": (1, "", "Invalid job id specified")})
    (status,) = job_status.job_status(record.job_id, forgotten)
    (row,) = [line for line in status.lines() if line.startswith("last recovery:")]
    assert "failed: rank 1 on n1: hung; detected " in row and "first step +135.0 s" in row
