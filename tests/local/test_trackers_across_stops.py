"""`hpcddp train` with TensorBoard, W&B (offline) and MLflow (its file store), stopped twice and
resumed, as a twice-preempted job lives: each tracker ends with one run holding each step once
and in order, the values metrics.jsonl holds, the params once, and the run's end in its own
terms. Read back with each library's own reader."""

import json
import pathlib

import pytest

from tests.fixtures import wandb_records
from tests.fixtures.helpers import QUICKSTART, run_cli, wait_until

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
STEPS = 16


def logged(run_dir: pathlib.Path, key: str) -> list[tuple[int, float]]:
    """(step, value) of ``key`` in metrics.jsonl: what every tracker must hold, in order."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r[key]) for r in lines if key in r and "event" not in r]


def test_each_tracker_holds_one_run_across_two_stops_and_says_it_finished(tmp_path, monkeypatch):
    """One job for the three (the suite deals tests out one by one: a module fixture would
    run the three attempts once per worker)."""
    tracked = tmp_path / "run"
    stopped_twice(tracked)
    tensorboard_holds_every_step_once_with_its_value(tracked)
    wandb_is_one_run_with_every_step_once_its_values_and_its_end(tracked)
    mlflow_is_one_finished_run_with_every_step_once_and_its_values(tracked, monkeypatch)


def stopped_twice(run_dir: pathlib.Path) -> None:
    """One run stopped at each of STOPS, then finished."""
    quiet = {"WANDB_SILENT": "true", "WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": ""}
    for stop in (*(f"train.stop_after_steps={s}" for s in STOPS), None):
        extra = [stop] if stop else []
        done = run_cli(
            "train", QUICKSTART, f"run.dir={run_dir}", *RUN, *extra, "--nproc", "2", env=quiet
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == STEPS


def tensorboard_holds_every_step_once_with_its_value(tracked: pathlib.Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tracked / "tracking" / "tensorboard"))
    events.Reload()
    for key in ("loss", "eval_loss"):  # what an earlier attempt wrote past its checkpoint: purged
        points = [(e.step, e.value) for e in events.Scalars(key)]
        assert points == [(s, pytest.approx(v, rel=1e-6)) for s, v in logged(tracked, key)], key
    assert [e.step for e in events.Tensors("params/text_summary")] == [0]  # the params, once


def wandb_is_one_run_with_every_step_once_its_values_and_its_end(tracked: pathlib.Path) -> None:
    run_id = json.loads((tracked / "tracking" / "run.json").read_text())["run_id"]
    logs = sorted((tracked / "tracking" / "wandb").glob("offline-run-*/*.wandb"))
    assert len(logs) == len(STOPS) + 1  # one offline log per attempt, all of one run
    for log in logs:  # wandb's own process may still be writing after finish() returned
        wait_until(lambda log=log: wandb_records.ended(log), f"W&B's exit record in {log}", 60)
    assert {wandb_records.run(log)[0] for log in logs} == {run_id}
    configs = [wandb_records.run(log)[1]["config"] for log in logs]
    assert configs[0]["optim"]["lr"] == 0.003 and configs[0]["train"]["epochs"] == 2
    for config in configs:  # the same run's config each time, but for where it was told to stop
        config["train"].pop("stop_after_steps")
    assert all(c == configs[0] for c in configs)
    points = [point for log in logs for point in wandb_records.history(log)]
    steps = [p["_step"] for p in points]
    assert steps == sorted(set(steps))  # each step once, in order, across the attempts
    for key in ("loss", "eval_loss"):
        got = [(p["_step"], p[key]) for p in points if key in p]
        assert got == [(s, pytest.approx(v)) for s, v in logged(tracked, key)], key
    # the stopped attempts marked themselves preempting; the last finished (exit code 0)
    assert [wandb_records.preempting(log) for log in logs] == [True, True, False]
    assert [wandb_records.exit_code(log) for log in logs] == [0, 0, 0]


def mlflow_is_one_finished_run_with_every_step_once_and_its_values(
    tracked: pathlib.Path, monkeypatch
) -> None:
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.tracking.MlflowClient((tracked / "tracking" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("across-stops")
    (run,) = client.search_runs([experiment.experiment_id])
    state = json.loads((tracked / "tracking" / "run.json").read_text())
    assert run.info.run_id == state["mlflow_run_id"]
    assert run.info.status == "FINISHED"  # not KILLED, not RUNNING: it trained to its end
    params = run.data.params  # recorded once, when the run was made
    assert params["config.optim.lr"] == "0.003" and params["config.train.epochs"] == "2"
    assert params["world_size"] == "2"
    for key in ("loss", "eval_loss"):
        history = client.get_metric_history(run.info.run_id, key)
        got = sorted((m.step, m.value) for m in history)
        assert got == [(s, pytest.approx(v)) for s, v in logged(tracked, key)], key
