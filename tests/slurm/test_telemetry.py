"""Per-rank telemetry on the real cluster: a rank held back by its node is named, by host, in
metrics.jsonl, the log and `hpcddp status`; the summary holds the start-up timeline."""

import json
import re
import subprocess
import sys

import pytest

from hpcddp.train.timeline import PHASES
from tests.fixtures.helpers import QUICK, REPO, run_cli

pytestmark = pytest.mark.slow


def test_a_slowed_rank_is_named_as_the_slowest_by_rank_and_host(slurm_cluster, tmp_path):
    slow = slurm_cluster.nodes[1]  # rank 3 of 2 nodes x 2 ranks
    run_dir = tmp_path / "run"
    _, output = slurm_cluster.sbatch(
        tmp_path,
        "sbatch/train.sh",
        "examples/quickstart.yaml",
        f"run.dir={run_dir}",
        *QUICK,
        "train.log_every_steps=4",
        "model.factory=tests.fixtures.slow_rank:make_model",
        "model.kwargs={rank: 3, delay_s: 0.02}",
        options=("--nodes=2", "--ntasks-per-node=2", "--job-name=slowrank"),
    )
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    assert steps and all(line["slowest_host"] == slow for line in steps), steps
    # the median is a normal rank's own work: a few ms against the slow rank's 20 ms sleep
    assert all(line["slowest_rank"] == 3 and line["slowest_vs_median"] > 1.5 for line in steps)
    assert all(line["work_s_max"] >= 0.02 for line in steps)  # the sleep is counted as work
    assert all(line["samples_per_s"] > 0 and line["forward_s"] > 0 for line in steps)
    assert f"rank 3 on {slow} is" in output  # rank 0's warning in the job's output

    status = run_cli("status", str(run_dir), env=slurm_cluster.cli_env)
    assert f"slowest_host:     {slow}" in status.stdout, status.stdout

    timeline = json.loads((run_dir / "summary.json").read_text())["timeline"]
    assert list(timeline) == list(PHASES)
    assert all(row["max_s"] >= row["median_s"] >= 0 for row in timeline.values())


@pytest.mark.benchmark
def test_the_startup_benchmark_runs_both_arms_and_prints_the_timeline(slurm_cluster):
    """The smoke run of `tests/benchmarks/startup.py` on this cluster (figures not checked)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.startup", "--quick", "--steps", "5",
         "--slurm-conf", slurm_cluster.conf],
        cwd=REPO, env=slurm_cluster.env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert re.search(r"^\s+4\s+\d+\.\d\s+\d+\.\d\s+\d\.\d{3}$", done.stdout, re.M), done.stdout
    for phase in PHASES:
        assert re.search(rf"^{phase}\s+\d+\.\d{{3}}\s+\d+\.\d{{3}}\s+\d ", done.stdout, re.M)
