"""`hpcddp train` with TensorBoard, W&B (offline) and MLflow (a real tracking server on
loopback with its own SQLite store, as a site runs one), stopped twice and resumed, as a
twice-preempted job lives: each tracker ends with one run holding each step once and in order,
the values metrics.jsonl holds, the params once, and the run's end in its own terms, read back
with each library's own reader (`tests.fixtures.tracker_reads`); what reached the server went
in batches, not one request per value. Rank 1 runs too: only rank 0 may open a tracking run.
MLflow's file store is driven the same way across a chain's links (`tests/slurm/test_chain.py`)."""

import json

import pytest

from tests.fixtures.helpers import QUICKSTART, run_cli
from tests.fixtures.mlflow_server import tracking_server
from tests.fixtures.tracker_reads import logged, mlflow_holds, tensorboard_holds, wandb_holds

pytestmark = pytest.mark.slow

# 2 ranks, 512 samples of 32: 8 steps an epoch, 16 in all, an evaluation after each epoch
RUN = [
    "data.kwargs={train_size: 512, eval_size: 64}",
    "data.batch_size=32",
    "train.epochs=2",
    "train.log_every_steps=1",
    "train.checkpoint_every_steps=4",
    "tracking.backends=[tensorboard,wandb,mlflow]",
    "tracking.project=across-stops",
]
STOPS = (5, 11)  # inside the first epoch and inside the second
QUIET = {"WANDB_SILENT": "true", "WANDB_MODE": "offline"}


def test_each_tracker_holds_one_run_across_two_stops_and_says_it_finished(tmp_path):
    run_dir = tmp_path / "run"
    with tracking_server(tmp_path / "mlflow-server") as server:
        env = {**QUIET, "MLFLOW_TRACKING_URI": server.uri}
        for stop in (*(f"train.stop_after_steps={s}" for s in STOPS), None):
            extra = [stop] if stop else []
            done = run_cli(
                "train", QUICKSTART, f"run.dir={run_dir}", *RUN, *extra, "--nproc", "2", env=env
            )
            assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads((run_dir / "summary.json").read_text())["steps"] == 16
        tensorboard_holds(run_dir)
        config = wandb_holds(run_dir, attempts=len(STOPS) + 1)
        assert config["optim"]["lr"] == 0.003 and config["train"]["epochs"] == 2
        params = mlflow_holds(run_dir, "across-stops", server.store_uri)

    assert params["config.optim.lr"] == "0.003" and params["config.train.epochs"] == "2"
    assert params["world_size"] == "2"
    # each attempt but the last stopped (KILLED) and the next resumed it; the last finished
    statuses = [r.body["status"] for r in server.calls("runs/update")]
    assert statuses == ["KILLED", "RUNNING", "KILLED", "RUNNING", "FINISHED"], statuses
    # batches: never a request per value, each param sent once, each logged line in one request
    assert not server.calls("runs/log-metric") and not server.calls("runs/log-parameter")
    batches = [r.body for r in server.calls("runs/log-batch")]
    sent = [p["key"] for batch in batches for p in batch.get("params", [])]
    assert sorted(sent) == sorted(params)
    assert sum(1 for batch in batches if batch.get("params")) == -(-len(params) // 100)
    with_metrics = [batch["metrics"] for batch in batches if batch.get("metrics")]
    lines = len(logged(run_dir, "loss")) + len(logged(run_dir, "eval_loss"))
    assert len(with_metrics) == lines, (len(with_metrics), lines)
    assert sum(map(len, with_metrics)) > 2 * lines  # several values a request
