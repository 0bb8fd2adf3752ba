"""Tracking across requeues: one run, each step exactly once, with the real libraries.

Three attempts of one run, the way a twice-preempted job lives: each attempt resumes from the
checkpoint before its predecessor stopped, so the predecessor already logged some steps the
new attempt logs again. TensorBoard (read back with its own reader), MLflow (its own client)
and W&B (offline) must end with one run holding each step once.
"""

import json
import pathlib
from typing import ClassVar

import pytest

from hpcddp.errors import ConfigError
from hpcddp.records import tracking
from hpcddp.records.metrics_log import MetricsLog
from hpcddp.records.tracking import Tracker
from tests.fixtures import wandb_records
from tests.fixtures.helpers import wait_until

pytest.importorskip("tensorboard")  # the [test] extra installs it; CI fails on any skip

# (resumed from the checkpoint at step, last step logged before the stop) per attempt
ATTEMPTS = [(0, 10), (6, 15), (12, 20)]
PARAMS = {"optim": {"lr": 0.1, "name": "adamw"}, "world_size": 4}


def loss(step: int) -> float:
    """What an exactly resumed run logs at ``step``, whichever attempt logs it."""
    return 1.0 / step


def run_attempts(run_dir: pathlib.Path, backends: list[str]) -> None:
    for resume_step, last in ATTEMPTS:
        tracker = Tracker(backends, run_dir, resume_step, PARAMS, project="hpcddp-test")
        for step in range(resume_step + 1, last + 1):
            tracker.log(step, {"step": step, "loss": loss(step), "note": "text is skipped"})
        tracker.close()


def test_tensorboard_holds_each_step_once_with_the_values_of_an_unbroken_run(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_attempts(tmp_path, ["tensorboard"])
    events = EventAccumulator(str(tmp_path / "tracking" / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [
        (step, pytest.approx(loss(step))) for step in range(1, 21)
    ]
    assert "note" not in events.Tags()["scalars"]


def test_mlflow_holds_each_step_once_in_one_run(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow = pytest.importorskip("mlflow")
    run_attempts(tmp_path, ["mlflow"])
    state = json.loads((tmp_path / "tracking" / "run.json").read_text())
    client = mlflow.tracking.MlflowClient((tmp_path / "tracking" / "mlruns").as_uri())
    history = client.get_metric_history(state["mlflow_run_id"], "loss")
    assert sorted(m.step for m in history) == list(range(1, 21))
    params = client.get_run(state["mlflow_run_id"]).data.params
    assert params["optim.lr"] == "0.1" and params["world_size"] == "4"


def test_wandb_offline_is_one_run_holding_each_step_once_with_its_values(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_attempts(tmp_path, ["wandb"])
    run_id = json.loads((tmp_path / "tracking" / "run.json").read_text())["run_id"]
    logs = sorted((tmp_path / "tracking" / "wandb").glob("offline-run-*/*.wandb"))
    assert len(logs) == len(ATTEMPTS)  # one offline log per attempt, all of one run
    for log in logs:  # wandb's own process may still be writing after finish() returned
        wait_until(lambda log=log: wandb_records.ended(log), f"W&B's exit record in {log}", 60)
    for log in logs:
        assert wandb_records.run(log) == (run_id, {"_wandb": {}, **PARAMS})
    points = [point for log in logs for point in wandb_records.history(log)]
    assert [(p["_step"], p["loss"]) for p in points] == [
        (step, pytest.approx(loss(step))) for step in range(1, 21)
    ]
    assert not any("note" in p for p in points)  # text is not a metric


class Recorder(tracking.Backend):
    """A backend that cannot forget a point, recording what it was given."""

    name = "wandb"
    seen: ClassVar[list[int]] = []

    def __init__(self, folder, state, params):
        pass

    def log(self, step, values):
        Recorder.seen.append(step)

    def close(self, ending):
        pass


def test_a_backend_that_cannot_forget_gets_each_step_once(tmp_path, monkeypatch):
    monkeypatch.setitem(tracking._CLASSES, "wandb", Recorder)
    Recorder.seen = []
    run_attempts(tmp_path, ["wandb"])
    assert Recorder.seen == list(range(1, 21))


def test_the_high_water_mark_is_written_before_the_point(tmp_path, monkeypatch):
    """A crash between the two loses the point; it can never be written twice."""

    class Crashing(Recorder):
        def log(self, step, values):
            raise KeyboardInterrupt  # killed while the library writes

    monkeypatch.setitem(tracking._CLASSES, "wandb", Crashing)
    tracker = Tracker(["wandb"], tmp_path, 0, PARAMS, project="p")
    with pytest.raises(KeyboardInterrupt):
        tracker.log(3, {"loss": 1.0})
    saved = json.loads((tmp_path / "tracking" / "run.json").read_text())
    assert saved["written"] == {"wandb": 3}


def test_metrics_log_feeds_the_tracker_and_marks_the_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = tmp_path / "metrics.jsonl"
    metrics = MetricsLog(path, 0, Tracker(["tensorboard"], tmp_path, 0, PARAMS, "p"))
    metrics.write(step=5, loss=0.5, lr=0.1)
    metrics.close()
    resumed = MetricsLog(path, 5, Tracker(["tensorboard"], tmp_path, 5, PARAMS, "p"))
    resumed.write(step=6, loss=0.4, lr=0.1)
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tracking" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [5, 6]
    assert "event" not in events.Tags()["scalars"]


@pytest.mark.parametrize("names", [["tensorbord"], ["tensorboard", "neptune"]])
def test_an_unknown_backend_is_refused_naming_the_valid_ones(tmp_path, names):
    with pytest.raises(ConfigError, match="is not one of \\['tensorboard', 'wandb', 'mlflow'\\]"):
        Tracker(names, tmp_path, 0, PARAMS, "p")


def test_a_missing_library_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # as if not installed
    with pytest.raises(ConfigError, match="pip install 'hpcddp\\[tracking\\]'"):
        Tracker(["wandb"], tmp_path, 0, PARAMS, "p")


def test_mlflow_sends_each_step_in_one_request_and_tells_how_each_attempt_ended(
    tmp_path, monkeypatch
):
    """A tracking server is remote: one request per logged step, not one per value. Its run
    is KILLED while stopped (resumable), RUNNING again once resumed, FINISHED at its end."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client_class = mlflow.tracking.MlflowClient
    requests = []
    for name in ("log_metric", "log_batch"):
        real = getattr(client_class, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            requests.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(client_class, name, counted)

    def status() -> str:
        run_id = json.loads((tmp_path / "tracking" / "run.json").read_text())["mlflow_run_id"]
        return client_class((tmp_path / "tracking" / "mlruns").as_uri()).get_run(run_id).info.status

    first = Tracker(["mlflow"], tmp_path, 0, PARAMS, project="p")
    assert requests == ["log_batch"]  # the params, in one request
    requests.clear()
    first.log(1, {"loss": 1.0, "lr": 0.1, "grad_norm": 2.0, "samples_per_s": 90.0})
    first.log(2, {"loss": 0.5, "lr": 0.1, "grad_norm": 1.0, "samples_per_s": 95.0})
    assert requests == ["log_batch", "log_batch"]
    first.close("stopped")
    assert status() == "KILLED"
    second = Tracker(["mlflow"], tmp_path, 2, PARAMS, project="p")
    assert status() == "RUNNING"
    second.close("finished")
    assert status() == "FINISHED"
    Tracker(["mlflow"], tmp_path, 2, PARAMS, project="p").close("failed")
    assert status() == "FAILED"


def test_an_evaluation_at_its_steps_own_step_reaches_a_backend_that_cannot_forget(
    tmp_path, monkeypatch
):
    """The evaluation after step 8 is logged at step 8, after that step's own line: it is new
    there, not a repeat; an attempt resumed from step 4 then repeats neither."""
    given = []

    class Keys(Recorder):
        def log(self, step, values):
            given.append((step, sorted(values)))

    monkeypatch.setitem(tracking._CLASSES, "wandb", Keys)
    for resume_step in (0, 4):
        tracker = Tracker(["wandb"], tmp_path, resume_step, PARAMS, project="p")
        for step in range(resume_step + 1, 9):
            tracker.log(step, {"loss": loss(step)})
        tracker.log(8, {"eval_loss": 0.5, "eval_accuracy": 0.7})
        tracker.close("stopped")
    assert given == [(s, ["loss"]) for s in range(1, 9)] + [(8, ["eval_accuracy", "eval_loss"])]
