"""``hpcddp sweep --cluster local``: a grid run by submitit's local executor on this machine, no
Slurm; the sweep directory, the status table and each point's own run, as a user checks them."""

import json
import pathlib

import pytest
import yaml

from tests.fixtures.helpers import QUICKSTART, TINY, run_cli, summary, wait_until

pytestmark = pytest.mark.slow


def rows(sweep_dir: pathlib.Path) -> list[dict]:
    """``hpcddp status SWEEP_DIR --json``."""
    told = run_cli("status", str(sweep_dir), "--json")
    assert told.returncode == 0, told.stderr
    return json.loads(told.stdout)


def test_a_local_sweep_runs_every_point_with_its_own_value(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # one rank a point is enough to tell the points apart
    submitted = run_cli(
        "sweep", QUICKSTART, "--grid", "optim.lr=0.001,0.1", "--cluster", "local",
        f"run.dir={sweep_dir}", *TINY, "train.log_every_steps=1", "slurm.tasks_per_node=1",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    printed_dir, job = submitted.stdout.split()
    assert printed_dir == str(sweep_dir) and job.startswith("local-"), submitted.stdout
    results = sweep_dir / "submitit"  # what task 0 of each point leaves as it returns or raises
    wait_until(lambda: len(list(results.glob("*_0_result.pkl"))) == 2, "both points", timeout=240)
    got = rows(sweep_dir)
    assert [(r["index"], r["grid"], r["state"], r["step"]) for r in got] == [
        (0, {"optim.lr": 0.001}, "completed", 2),
        (1, {"optim.lr": 0.1}, "completed", 2),
    ], got
    # each point ran in its own directory, with its own value, and trained differently
    runs = [pathlib.Path(r["run_dir"]) for r in got]
    assert [p.parent for p in runs] == [sweep_dir, sweep_dir]
    lrs = [yaml.safe_load((p / "config.yaml").read_text())["optim"]["lr"] for p in runs]
    assert lrs == [0.001, 0.1]
    losses = [summary(p)["final_loss"] for p in runs]
    assert losses[0] != losses[1]
    table = run_cli("status", str(sweep_dir)).stdout
    assert "2 points: 2 completed" in table, table
    again = run_cli("sweep", "--retry-failed", str(sweep_dir))
    assert again.returncode == 0 and "nothing to retry" in again.stdout, again.stdout
