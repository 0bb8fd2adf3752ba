"""``hpcddp sweep`` on the real cluster: a 2 x 2 grid where two points lose their node once.

The points with ``model.kwargs.die_at_call=20`` die at their 20th step in the first array (a
node death: SIGKILL, with ``slurm.max_failures=0``, so nothing retries it); ``hpcddp status
SWEEP_DIR`` then shows 2 completed with eval metrics and 2 failed with srun's reason;
``--retry-failed`` resubmits only those 2 as a new array over the same run directories, they
resume from their checkpoints and complete, and the table shows 4 completed; ``--json`` agrees.
One sweep (and one retry) serves every check below. Every point trains sharded
(``dist.strategy=fsdp``, one rank: a sweep's points are as often one GPU each), so the retried
points resume from sharded checkpoints.
"""

import json
import pathlib
import re
import time

import pytest

from tests.fixtures.helpers import QUICKSTART, REPO, SHARDED, run_cli

pytestmark = pytest.mark.slow

SETTINGS = (
    "data.kwargs={train_size: 1024, eval_size: 256}",
    "data.batch_size=32",
    "train.epochs=1",  # 32 steps at one rank
    "train.checkpoint_every_steps=8",
    "train.log_every_steps=4",
    "slurm.max_failures=0",
    "model.factory=tests.fixtures.dies_once:make_model",
    *SHARDED,
)
GRID = ("--grid", "optim.lr=0.001,0.003", "--grid", "model.kwargs.die_at_call=0,20")
DYING = (1, 3)  # lr first (slowest), die_at_call second


def _wait_ended(sweep_dir: pathlib.Path, env: dict, timeout: float = 240) -> list[dict]:
    """Poll ``hpcddp status SWEEP_DIR --json`` until no point is pending or running."""
    deadline = time.monotonic() + timeout
    while True:
        shown = run_cli("status", str(sweep_dir), "--json", env=env, timeout=60)
        assert shown.returncode == 0, shown.stderr
        rows = json.loads(shown.stdout)
        if all(row["state"] not in ("pending", "running", "preempted") for row in rows):
            return rows
        assert time.monotonic() < deadline, f"sweep still running: {rows}"
        time.sleep(3)


def _table(sweep_dir: pathlib.Path, env: dict) -> list[dict]:
    """The status table's rows as {column: cell} (columns split on two or more spaces)."""
    shown = run_cli("status", str(sweep_dir), env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    print(shown.stdout)  # docs/ways-in.md's table comes from here
    lines = shown.stdout.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[1 : lines.index("")]]
    return [dict(zip(header, row, strict=False)) for row in rows]


def test_two_points_fail_once_and_the_retry_completes_them(slurm_cluster, tmp_path):
    """One sweep and one retry, checked below part by part (one test: xdist would otherwise
    split the parts across workers, each running its own sweep)."""
    sweep = _run_the_sweep(slurm_cluster, tmp_path)
    check_the_sweep_prints_its_directory_and_job_id(sweep)
    check_two_completed_with_eval_metrics_and_two_failed_with_their_reason(sweep)
    check_retry_completes_only_the_failed_points_which_resume(sweep)
    check_json_agrees_with_the_table(sweep)
    check_plot_overlays_the_points(sweep)


def _run_the_sweep(slurm_cluster, tmp) -> dict:
    """The sweep, its tables and JSON before and after the retry, and what each command said."""
    env = {**slurm_cluster.cli_env, "HPCDDP_JOBS_DIR": str(tmp / "jobs")}
    base, deaths = tmp / "sweep", tmp / "deaths"
    deaths.mkdir()
    started = time.monotonic()
    first = run_cli(
        "sweep", QUICKSTART, *GRID, f"run.dir={base}", *SETTINGS,
        f"model.kwargs.record_dir={deaths}", "--tasks-per-node", "1", env=env, timeout=120,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    before_json = _wait_ended(base, env)
    before = _table(base, env)
    retry = run_cli("sweep", "--retry-failed", str(base), env=env, timeout=120)
    assert retry.returncode == 0, retry.stderr
    after_json = _wait_ended(base, env)
    again = run_cli("sweep", "--retry-failed", str(base), env=env, timeout=120)
    after = _table(base, env)
    print(f"sweep, retry and status: {time.monotonic() - started:.1f} s")
    return {
        "base": base, "first": first, "retry": retry, "again": again, "before": before,
        "before_json": before_json, "after": after, "after_json": after_json,
        "env": env, "cluster": slurm_cluster,
    }  # fmt: skip


def check_the_sweep_prints_its_directory_and_job_id(sweep):
    sweep_dir, job = sweep["first"].stdout.split()
    assert pathlib.Path(sweep_dir) == sweep["base"] and job.isdigit()
    manifest = json.loads((sweep["base"] / "sweep.json").read_text())
    assert manifest["arrays"][0]["job_id"] == job
    assert [t["job"] for t in manifest["arrays"][0]["tasks"]] == [f"{job}_{i}" for i in range(4)]


def check_two_completed_with_eval_metrics_and_two_failed_with_their_reason(sweep):
    rows = sweep["before"]
    assert [r["state"] for r in rows] == ["completed", "failed", "completed", "failed"]
    assert [(r["optim.lr"], r["model.kwargs.die_at_call"]) for r in rows] == [
        ("0.001", "0"), ("0.001", "20"), ("0.003", "0"), ("0.003", "20"),
    ]  # fmt: skip
    nodes = "|".join(sweep["cluster"].nodes)
    for row in rows:
        if row["state"] == "completed":
            assert row["step"] == "32" and re.fullmatch(
                r"[\d.]+ \([\d.]+\)", row["eval_loss (best)"]
            )
            assert row["attempts"] == "1" and "reason" not in row
        else:
            assert re.fullmatch(rf"task 0 on ({nodes}): Killed", row["reason"]), row
            assert row["eval_loss (best)"] == "-" and int(row["step"]) >= 16
    by_json = {r["index"]: r for r in sweep["before_json"]}
    assert [by_json[i]["state"] for i in range(4)] == [r["state"] for r in rows]


def check_retry_completes_only_the_failed_points_which_resume(sweep):
    base = sweep["base"]
    sweep_dir, job = sweep["retry"].stdout.split()
    manifest = json.loads((base / "sweep.json").read_text())
    assert manifest["arrays"][1]["job_id"] == job and pathlib.Path(sweep_dir) == base
    assert [t["index"] for t in manifest["arrays"][1]["tasks"]] == list(DYING)
    rows = sweep["after"]
    assert [r["state"] for r in rows] == ["completed"] * 4
    assert [r["attempts"] for r in rows] == ["1", "2", "1", "2"]
    assert {r["step"] for r in rows} == {"32"}
    for index in DYING:  # resumed from a checkpoint in its own run directory
        run_dir = pathlib.Path(manifest["points"][index]["run_dir"])
        lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert any(r.get("event") == "resumed" for r in lines)
        assert {c.suffix for c in (run_dir / "checkpoints").iterdir()} == {".dcp"}
    # die_at_call changes nothing but the death, and resume is exact: same lr, same metrics
    final = [r["metrics"]["final"] for r in sweep["after_json"]]
    assert final[0] == final[1] and final[2] == final[3] and final[0] != final[2]
    assert "nothing to retry" in sweep["again"].stdout and sweep["again"].returncode == 0


def check_json_agrees_with_the_table(sweep):
    rows, table = sweep["after_json"], sweep["after"]
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert [r["grid"] for r in rows] == [
        {"optim.lr": lr, "model.kwargs.die_at_call": die}
        for lr in (0.001, 0.003)
        for die in (0, 20)
    ]
    for row, shown in zip(rows, table, strict=True):
        final, best = row["metrics"]["final"]["eval_loss"], row["metrics"]["best"]["eval_loss"]
        assert shown["eval_loss (best)"] == f"{final:.4g} ({best:.4g})"
        assert (shown["state"], shown["step"], shown["attempts"]) == (
            row["state"], str(row["step"]), str(row["attempts"]),
        )  # fmt: skip


def check_plot_overlays_the_points(sweep):
    drawn = run_cli("plot", str(sweep["base"]), env=sweep["env"], timeout=120, cwd=REPO)
    assert drawn.returncode == 0, drawn.stderr
    assert pathlib.Path(drawn.stdout.strip()).read_bytes().startswith(b"\x89PNG")
