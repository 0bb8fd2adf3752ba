"""A sweep's bookkeeping where the README makes promises: a point stopped before its end is
retried, a point's requeues count as attempts, and a moved sweep directory is refused.

Slurm is faked at its edge only (the ``squeue`` call); the files are those a real run leaves:
submitit's result pickle, attempts.jsonl, the manifest `hpcddp sweep` writes.
"""

import json
import pathlib
import pickle
import subprocess

import pytest

from hpcddp.config import load_config
from hpcddp.errors import ConfigError
from hpcddp.outcome import RunOutcome, StopReason
from hpcddp.records import sweep_manifest
from hpcddp.slurm import sweep_retry, sweep_status, sweep_submit
from hpcddp.slurm.grid import point_config
from tests.fixtures.helpers import QUICKSTART, REPO

SUBMITTED_AT = 1_000_000.0


def squeue(lines: list[str]):
    """A subprocess.run stand-in answering squeue with ``lines``."""

    def run(command, **kwargs):
        assert command[0] == "squeue", command
        return subprocess.CompletedProcess(command, 0, "".join(x + "\n" for x in lines), "")

    return run


def make_sweep(sweep_dir, count: int = 2) -> sweep_manifest.Manifest:
    """A manifest as `hpcddp sweep` writes it: ``count`` points over optim.lr, one array (job 7)."""
    base = load_config(str(REPO / QUICKSTART), [f"run.dir={sweep_dir}"])
    points = tuple(
        sweep_manifest.Point(i, {"optim.lr": lr}, point_config(base, i, [("optim.lr", lr)]).run.dir)
        for i, lr in enumerate((0.001, 0.003, 0.01)[:count])
    )
    tasks = tuple(
        sweep_manifest.Task(
            i, f"7_{i}", str(sweep_dir / f"7_{i}.out"), str(sweep_dir / f"7_{i}.err")
        )
        for i in range(count)
    )
    manifest = sweep_manifest.Manifest(
        grid={"optim.lr": [p.grid["optim.lr"] for p in points]},
        points=points,
        arrays=(sweep_manifest.Array("7", "slurm", SUBMITTED_AT, tasks),),
        config=base.to_dict(),
    )
    sweep_manifest.write(sweep_dir, manifest)
    for point in points:
        pathlib.Path(point.run_dir).mkdir()
    return manifest


def returned(sweep_dir, job: str, outcome: RunOutcome) -> None:
    """What submitit records when the task returned ``outcome``."""
    folder = sweep_dir / "submitit"
    folder.mkdir(exist_ok=True)
    (folder / f"{job}_0_result.pkl").write_bytes(pickle.dumps(("success", outcome)))


def test_a_point_stopped_before_its_end_is_retried(tmp_path, monkeypatch):
    make_sweep(tmp_path)
    # point 0 was stopped (a stop file, or preempted with nothing left to requeue it): its task
    # returned a stopped outcome and Slurm has forgotten it; point 1 is still running
    returned(tmp_path, "7_0", RunOutcome(step=12, stop=StopReason.PREEMPTED))
    rows = sweep_status.sweep_rows(tmp_path, squeue(["7_1|RUNNING|c2n1|None"]))
    assert [(r.state, r.reason, r.ended) for r in rows] == [
        ("preempted", "stopped before its end", True),
        ("running", "", False),
    ]
    submitted = []
    monkeypatch.setattr(
        sweep_retry, "submit_points", lambda m, indices, cluster: submitted.append(list(indices))
    )
    sweep_retry.retry_failed(tmp_path, run=squeue(["7_1|RUNNING|c2n1|None"]))
    assert submitted == [[0]]


def test_a_points_requeues_count_as_attempts(tmp_path):
    manifest = make_sweep(tmp_path)
    # one submission of point 0, requeued twice by Slurm within its job: three attempts
    run_dir = pathlib.Path(manifest.points[0].run_dir)
    causes = ["preempted", "preempted", "finished"]
    lines = [{"job": "7_0", "restart": n, "cause": c} for n, c in enumerate(causes)]
    (run_dir / "attempts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = sweep_status.sweep_rows(tmp_path, squeue(["7_0|RUNNING|c2n1|None"]))
    assert [r.attempts for r in rows] == [3, 1]
    table = sweep_status.as_table(rows, tmp_path).splitlines()
    assert table[1].split()[-1] == "3"  # the attempts column


def test_a_moved_sweep_directory_is_refused_before_anything_is_submitted(tmp_path, monkeypatch):
    made = tmp_path / "made-here"
    make_sweep(made)
    moved = tmp_path / "moved-there"
    made.rename(moved)
    submitted = []
    monkeypatch.setattr(sweep_submit, "executor_for", lambda *a, **k: submitted.append(a))
    with pytest.raises(ConfigError) as raised:
        sweep_retry.retry_failed(moved, run=squeue(["7_0|TIMEOUT|c2n1|TimeLimit"]))
    message = str(raised.value)
    assert str(made) in message and "moved" in message and "HINT" in message
    assert "\n" not in message and submitted == []
    assert not made.exists()  # nothing recreated where the sweep used to be
