"""A sweep's rows from stand-in files: states, reasons, eval figures, the table, --json, retry.

Slurm is faked at its edge only (the ``squeue`` call); the run directories hold the files a
real run leaves (metrics.jsonl, summary.json, the job's stderr with srun's line).
"""

import json
import os
import subprocess

import pytest

from hpcddp.cli import main
from hpcddp.records import sweep_manifest
from hpcddp.slurm import sweep_retry, sweep_status
from hpcddp.slurm.sweep_status import point_state

SUBMITTED_AT = 1_000_000.0


def squeue(lines: list[str] | None):
    """A subprocess.run stand-in answering squeue with ``lines`` (None: the controller is down)."""
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        assert command[0] == "squeue", command
        if lines is None:
            return subprocess.CompletedProcess(command, 1, "", "slurm_load_jobs error: timeout")
        return subprocess.CompletedProcess(command, 0, "".join(x + "\n" for x in lines), "")

    run.calls = calls
    return run


def _metrics(run_dir, steps, evals) -> None:
    lines = [{"step": s, "loss": 1.0 / s} for s in steps]
    lines += [{"step": s, "eval_loss": loss, "eval_accuracy": acc} for s, loss, acc in evals]
    lines.sort(key=lambda r: r["step"])
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _summary(run_dir, mtime: float, **fields) -> None:
    path = run_dir / "summary.json"
    path.write_text(json.dumps({"steps": 32, **fields}))
    os.utime(path, (mtime, mtime))


@pytest.fixture
def sweep_dir(tmp_path):
    """Four points: 0 completed, 1 killed then retried (running), 2 killed, 3 timed out."""
    points = []
    for index, (lr, die) in enumerate([(0.001, 0), (0.001, 20), (0.003, 0), (0.003, 20)]):
        run_dir = tmp_path / f"{index}-p"
        run_dir.mkdir()
        points.append(sweep_manifest.Point(index, {"optim.lr": lr, "die": die}, str(run_dir)))
    arrays = []
    for job, indices, at in (("7", [0, 1, 2, 3], SUBMITTED_AT), ("9", [1], SUBMITTED_AT + 60)):
        tasks = [
            sweep_manifest.Task(i, f"{job}_{n}", str(tmp_path / f"{job}_{n}.out"),
                                str(tmp_path / f"{job}_{n}.err"))
            for n, i in enumerate(indices)
        ]  # fmt: skip
        arrays.append(sweep_manifest.Array(job, "slurm", at, tuple(tasks)))
    grid = {"optim.lr": [0.001, 0.003], "die": [0, 20]}
    manifest = sweep_manifest.Manifest(grid, tuple(points), tuple(arrays))
    sweep_manifest.write(tmp_path, manifest)
    _metrics(tmp_path / "0-p", [8, 16, 24, 32], [(16, 0.6, 0.7), (32, 0.5, 0.75)])
    _summary(tmp_path / "0-p", SUBMITTED_AT + 30)
    _metrics(tmp_path / "1-p", [8, 16, 24], [])
    _metrics(tmp_path / "2-p", [8, 16], [])
    _summary(tmp_path / "2-p", SUBMITTED_AT - 3600)  # a previous run's: not this job's end
    (tmp_path / "7_2.err").write_text(
        "some log line\nsrun: error: c2n1: task 0: Killed\nsrun: Terminating StepId=7.0\n"
    )
    _metrics(tmp_path / "3-p", [8], [])
    return tmp_path


QUEUE = ["7_0|COMPLETED|c2n1|None", "9_0|RUNNING|c2n2|None", "7_3|TIMEOUT|c2n2|TimeLimit"]


def test_each_point_shows_its_latest_jobs_state_reason_figures_and_attempts(sweep_dir):
    run = squeue(QUEUE)
    rows = sweep_status.sweep_rows(sweep_dir, run)
    assert len(run.calls) == 1 and "7,9" in run.calls[0]  # one squeue call for every point
    assert [(r.index, r.state, r.reason, r.step, r.attempts, r.job) for r in rows] == [
        (0, "completed", "", 32, 1, "7_0"),
        (1, "running", "", 24, 2, "9_0"),
        (2, "failed", "task 0 on c2n1: Killed", 16, 1, "7_2"),
        (3, "failed", "time limit reached (TIMEOUT)", 8, 1, "7_3"),
    ]
    assert rows[0].final == {"eval_loss": 0.5, "eval_accuracy": 0.75}
    assert [r.retryable for r in rows] == [False, False, True, True]


def test_a_point_slurm_requeues_or_still_runs_is_left_to_slurm_not_retried(sweep_dir):
    """docs/ways-in.md: --retry-failed leaves points pending, running or requeued by Slurm."""
    queue = ["7_0|PENDING|c2n1|None", "9_0|RUNNING|c2n2|None", "7_3|REQUEUED|c2n2|None"]
    rows = sweep_status.sweep_rows(sweep_dir, squeue(queue))
    assert [(r.state, r.retryable) for r in rows if r.index != 2] == [
        ("pending", False),
        ("running", False),
        ("preempted", False),
    ]


def test_the_table_and_json_say_the_same(sweep_dir):
    rows = sweep_status.sweep_rows(sweep_dir, squeue(QUEUE))
    assert sweep_status.as_table(rows, sweep_dir).splitlines() == [
        "index  optim.lr  die  state      step  eval_loss (best)  eval_accuracy (best)  attempts  reason",  # noqa: E501
        "0      0.001     0    completed  32    0.5 (0.5)         0.75 (0.75)           1",
        "1      0.001     20   running    24    -                 -                     2",
        "2      0.003     0    failed     16    -                 -                     1         task 0 on c2n1: Killed",  # noqa: E501
        "3      0.003     20   failed     8     -                 -                     1         time limit reached (TIMEOUT)",  # noqa: E501
        "",
        f"4 points: 1 completed, 1 running, 2 failed; resubmit the 2 failed with "
        f"`hpcddp sweep --retry-failed {sweep_dir}`",
    ]  # fmt: skip
    first = rows[0].as_json()
    assert first == {
        "index": 0, "grid": {"optim.lr": 0.001, "die": 0}, "state": "completed", "reason": "",
        "step": 32, "metrics": {"final": {"eval_loss": 0.5, "eval_accuracy": 0.75},
                                "best": {"eval_loss": 0.5, "eval_accuracy": 0.75}},
        "attempts": 1, "job": "7_0", "run_dir": str(sweep_dir / "0-p"),
    }  # fmt: skip


def test_the_cli_prints_the_table_or_json_for_a_sweep_dir_only(sweep_dir, monkeypatch, capsys):
    monkeypatch.setattr(subprocess, "run", squeue(QUEUE))
    assert main(["status", str(sweep_dir), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["index"], r["state"]) for r in rows] == [
        (0, "completed"), (1, "running"), (2, "failed"), (3, "failed"),
    ]  # fmt: skip
    assert main(["status", str(sweep_dir / "0-p"), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--json is for a sweep directory" in err and len(err.splitlines()) == 1


NO_SUMMARY = "but this job wrote no summary.json"
NAN = "non-finite loss at step 7"


@pytest.mark.parametrize(
    "slurm, outcome, expected",
    [
        ("PENDING", None, ("pending", "", False)),
        ("RUNNING", None, ("running", "", False)),
        ("REQUEUED", None, ("preempted", "requeued (REQUEUED)", False)),
        ("PREEMPTED", None, ("preempted", "requeued (PREEMPTED)", False)),
        ("COMPLETED", "COMPLETED", ("completed", "", True)),
        ("LEFT_QUEUE", "COMPLETED", ("completed", "", True)),
        (None, "COMPLETED", ("completed", "", True)),
        # Slurm's COMPLETED is only the batch script's exit status: no summary, no completion
        ("COMPLETED", None, ("failed", f"Slurm says COMPLETED, {NO_SUMMARY}", True)),
        ("FAILED", None, ("failed", "", True)),
        ("TIMEOUT", None, ("failed", "time limit reached (TIMEOUT)", True)),
        ("CANCELLED", None, ("failed", "cancelled (CANCELLED)", True)),
        ("LEFT_QUEUE", f"FAILED ({NAN})", ("failed", NAN, True)),
        ("LEFT_QUEUE", "STOPPED", ("preempted", "stopped before its end", True)),
    ],
)  # fmt: skip
def test_point_state(slurm, outcome, expected):
    assert point_state(slurm, outcome) == expected


def test_best_is_the_lowest_loss_and_the_highest_accuracy():
    records = [
        {"step": 1, "eval_loss": 0.9, "eval_accuracy": 0.5, "eval_perplexity": 9.0},
        {"step": 2, "eval_loss": 0.4, "eval_accuracy": 0.8, "eval_perplexity": 3.0},
        {"step": 3, "eval_loss": 0.6, "eval_accuracy": 0.7, "eval_perplexity": float("nan")},
        {"step": 3, "loss": 0.1},
    ]
    final, best = sweep_status.eval_figures(records)
    assert final == {"eval_loss": 0.6, "eval_accuracy": 0.7}  # NaN is no figure
    assert best == {"eval_loss": 0.4, "eval_accuracy": 0.8, "eval_perplexity": 3.0}


def test_a_silent_controller_is_unknown_not_failed_unless_the_files_know(sweep_dir):
    rows = sweep_status.sweep_rows(sweep_dir, squeue(None))
    assert [(r.state, r.ended) for r in rows] == [
        ("completed", True),  # its fresh summary.json says so without Slurm
        ("unknown", False),
        ("unknown", False),
        ("unknown", False),
    ]
    assert rows[1].reason == "Slurm did not answer squeue; try again"
    assert not any(r.retryable for r in rows)


def test_retry_resubmits_only_failed_points_into_their_run_dirs(sweep_dir, monkeypatch):
    submitted = []
    monkeypatch.setattr(
        sweep_retry, "submit_points", lambda manifest, indices, cluster: submitted.append(
            (list(indices), cluster)) or ["job"]
    )  # fmt: skip
    assert sweep_retry.retry_failed(sweep_dir, run=squeue(QUEUE)) == ["job"]
    assert submitted == [([2, 3], "slurm")]
    done = [x.replace("RUNNING", "COMPLETED").replace("TIMEOUT", "RUNNING") for x in QUEUE]
    _summary(sweep_dir / "1-p", SUBMITTED_AT + 90)
    (sweep_dir / "7_2.err").unlink()
    _summary(sweep_dir / "2-p", SUBMITTED_AT + 30)
    assert sweep_retry.retry_failed(sweep_dir, run=squeue(done)) == []


def test_a_local_sweep_asks_no_scheduler_and_reads_the_raised_error(tmp_path):
    import pickle

    points = [sweep_manifest.Point(i, {"optim.lr": lr}, str(tmp_path / f"{i}")) for i, lr in
              enumerate((0.1, 0.2))]  # fmt: skip
    tasks = [
        sweep_manifest.Task(i, f"local-{pid}", "/no/out", "/no/err")
        for i, pid in enumerate((999_999_998, 999_999_999))
    ]  # fmt: skip: no such pids
    array = sweep_manifest.Array("999999998", "local", SUBMITTED_AT, tuple(tasks))
    sweep_manifest.write(tmp_path, sweep_manifest.Manifest({}, tuple(points), (array,)))
    for point in points:
        os.makedirs(point.run_dir)
    _summary(tmp_path / "0", SUBMITTED_AT + 5)
    (tmp_path / "submitit").mkdir()
    raised = ("error", "Traceback (most recent call last):\n  ...\nValueError: bad batch\n")
    (tmp_path / "submitit" / "999999999_0_result.pkl").write_bytes(pickle.dumps(raised))
    run = squeue([])
    rows = sweep_status.sweep_rows(tmp_path, run)
    assert run.calls == []
    assert [(r.state, r.reason) for r in rows] == [
        ("completed", ""), ("failed", "ValueError: bad batch"),
    ]  # fmt: skip
