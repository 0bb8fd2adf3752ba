"""``hpcddp status RUN_DIR``: the latest figures from the run's own files, damage reported."""

import json
import socket
import subprocess
import sys

import pytest

from tests.fixtures.helpers import run_cli

HOLD = """
import pathlib, sys, time
from hpcddp.storage.runlock import RunLock
RunLock(pathlib.Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(60)
"""


def fields(text: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "config.yaml").write_text("run: {name: x}\n")
    records = [
        {"step": 10, "epoch": 0, "loss": 1.5, "lr": 0.01, "samples_per_s": 900.0},
        {"step": 10, "event": "resumed", "slurm_restart_count": "1"},
        {"step": 20, "epoch": 1, "loss": 1.25, "samples_per_s": 1000.0, "step_time_s": 0.1,
         "slowest_rank": 3, "slowest_host": "n2", "slowest_vs_median": 2.5},
        {"step": 20, "epoch": 1, "eval_loss": 1.3, "eval_accuracy": 0.75},
    ]  # fmt: skip
    lines = [json.dumps(r) for r in records]
    lines.insert(2, '{"step": 15, "lo')  # torn by a crash
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_latest_figures_of_a_run_directory(run_dir):
    done = run_cli("status", str(run_dir))
    assert done.returncode == 0, done.stderr
    got = fields(done.stdout)
    assert got["step"] == "20 (epoch 1)" and got["loss"] == "1.25"
    assert (got["slowest_rank"], got["slowest_host"], got["slowest_vs_median"]) == (
        "3",
        "n2",
        "2.5",
    )
    assert (got["eval_loss"], got["eval_accuracy"]) == ("1.3", "0.75")
    assert got["resumed"] == "1 time(s)" and got["metrics.jsonl"] == "1 damaged line(s) skipped"
    assert got["held by"] == "nobody (not running now)" and got["finished"] == "no"


def test_a_running_run_names_its_holder_and_a_damaged_summary_is_said(run_dir):
    (run_dir / "summary.json").write_text('{"steps": 2')
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        got = fields(run_cli("status", str(run_dir)).stdout)
    finally:
        holder.kill()
        holder.wait()
    assert got["held by"].startswith(f"host {socket.gethostname()}, pid {holder.pid}")
    assert got["finished"].startswith("damaged (")


def test_a_folder_that_is_no_run_is_one_line(tmp_path):
    done = run_cli("status", str(tmp_path))
    assert done.returncode == 2 and "is not a run directory" in done.stderr


def test_a_run_that_stopped_as_failed_is_not_called_finished(run_dir):
    summary = {"status": "failed", "reason": "nonfinite", "steps": 8}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    got = fields(run_cli("status", str(run_dir)).stdout)
    assert got["finished"] == "no: failed at step 8 (nonfinite)"
