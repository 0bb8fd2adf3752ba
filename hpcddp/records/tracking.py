"""Experiment tracking (TensorBoard, W&B offline, MLflow) behind one small interface, rank 0 only.

A run that Slurm preempts and requeues is one tracking run, not several: its id lives in
``RUN_DIR/tracking/run.json``, and no point is ever written twice for a step. TensorBoard is
told to purge what an earlier attempt wrote past the checkpoint this one resumes from (its
``purge_step``, which its own reader honours), and this attempt writes those steps again. W&B
and MLflow cannot forget a point, so for them the tracker skips every step up to the last one
written before (a high-water mark, recorded before each write: after a crash a point may be
missing, never doubled); with exact resume those points hold the values this attempt would
have logged anyway. The libraries are optional extras, imported only when chosen.
"""

import abc
import json
import logging
import os
import pathlib
import time
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from hpcddp.config.sections import TRACKING_BACKENDS as BACKENDS
from hpcddp.errors import ConfigError

log = logging.getLogger(__name__)

_EXTRA = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}
# How an attempt ended, for the trackers' own run states: trained to the end, failed (an
# error, a non-finite loss), or stopped to be resumed (preempted, handed on, asked, killed).
FINISHED, FAILED, STOPPED = "finished", "failed", "stopped"
ENDINGS = (FINISHED, FAILED, STOPPED)


class Backend(abc.ABC):
    """One tracking library; ``rewrites`` says whether it can drop points past a step."""

    name: ClassVar[str]
    rewrites: ClassVar[bool] = False

    @abc.abstractmethod
    def __init__(self, folder: pathlib.Path, state: "RunState", params: Mapping[str, Any]):
        """Open (or reopen, on resume) this run in ``folder``."""

    @abc.abstractmethod
    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Record ``values`` at ``step``."""

    @abc.abstractmethod
    def close(self, ending: str) -> None:
        """Flush and release files, saying how this attempt ended (`ENDINGS`); a stopped run
        stays resumable."""


class TensorBoard(Backend):
    """Event files in ``RUN_DIR/tracking/tensorboard`` (``tensorboard --logdir`` that folder)."""

    name, rewrites = "tensorboard", True

    def __init__(self, folder: pathlib.Path, state: "RunState", params: Mapping[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        purge = state.resume_step + 1 if state.resume_step else None
        self.writer = SummaryWriter(str(folder / "tensorboard"), purge_step=purge)
        if not state.resume_step:
            self.writer.add_text("params", f"```\n{json.dumps(params, indent=2)}\n```", 0)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self, ending: str) -> None:
        self.writer.close()  # event files hold no run state: the curves say it


class WandB(Backend):
    """An offline W&B run (``wandb sync RUN_DIR/tracking/wandb/offline-run-*`` uploads it).

    ``WANDB_MODE=online`` in the environment logs live instead; every attempt of the run uses
    the same run id, so the synced run is one run.
    """

    name = "wandb"

    def __init__(self, folder: pathlib.Path, state: "RunState", params: Mapping[str, Any]):
        import wandb

        self.run = wandb.init(
            project=state.project,
            id=state.run_id,
            resume="allow",
            mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
            dir=str(folder),
            config=dict(params),
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self, ending: str) -> None:
        if ending == STOPPED:
            self.run.mark_preempting()  # W&B's word for a run that will be resumed
        self.run.finish(exit_code=1 if ending == FAILED else 0)


class MLflow(Backend):
    """An MLflow run: on ``MLFLOW_TRACKING_URI`` if set (a tracking server), else a file store
    under the run dir. A server is remote: params and each step's values go in batches, never
    one request per value."""

    name = "mlflow"

    def __init__(self, folder: pathlib.Path, state: "RunState", params: Mapping[str, Any]):
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # offline, in the run dir
        import mlflow

        self.client = mlflow.tracking.MlflowClient(
            os.environ.get("MLFLOW_TRACKING_URI") or (folder / "mlruns").as_uri()
        )
        if state.mlflow_run_id:
            self.run_id = state.mlflow_run_id
            self.client.update_run(self.run_id, status="RUNNING")  # resumed: running again
            return
        experiment = self.client.get_experiment_by_name(state.project)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(state.project)
        )
        self.run_id = self.client.create_run(experiment_id, run_name=state.run_id).info.run_id
        from mlflow.entities import Param

        # in batches too (MLflow's client sends 100 a request), once, when the run is made
        recorded = [Param(key, str(value)[:500]) for key, value in _flat(params).items()]
        self.client.log_batch(self.run_id, params=recorded)
        state.mlflow_run_id = self.run_id

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """One request per logged step, not one per value (a tracking server is remote)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k.replace("/", "_"), v, now, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self, ending: str) -> None:
        # KILLED for a stop: a later attempt resumes the run and sets it RUNNING again
        status = {FINISHED: "FINISHED", FAILED: "FAILED"}.get(ending, "KILLED")
        self.client.set_terminated(self.run_id, status=status)


_CLASSES: dict[str, type[Backend]] = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


class RunState:
    """``RUN_DIR/tracking/run.json``: the run's id and what each backend has written so far."""

    def __init__(self, folder: pathlib.Path, project: str, resume_step: int) -> None:
        self.path = folder / "run.json"
        saved = self._read()
        self.run_id: str = saved.get("run_id") or uuid.uuid4().hex[:16]
        self.project = project
        self.resume_step = resume_step
        self.mlflow_run_id: str = saved.get("mlflow_run_id", "")
        self.written: dict[str, int] = {k: int(v) for k, v in saved.get("written", {}).items()}
        # the keys written at that last step: an evaluation's line shares its step with the
        # step's own line, and must not be taken for a repeat of it
        self.keys: dict[str, list[str]] = {k: list(v) for k, v in saved.get("keys", {}).items()}

    def unwritten(self, backend: str, step: int, values: Mapping[str, float]) -> dict[str, float]:
        """The values not yet written for ``step`` (none for a step before the last one
        written), now counted as written."""
        last = self.written.get(backend, -1)
        done = set(self.keys.get(backend, [])) if step == last else set()
        if step < last:
            return {}
        new = {k: v for k, v in values.items() if k not in done}
        if new:
            self.written[backend] = step
            self.keys[backend] = sorted(done | set(new))
        return new

    def _read(self) -> dict[str, Any]:
        try:
            saved = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            log.warning("%s is unreadable (%s); starting a new tracking run", self.path, err)
            return {}
        return saved if isinstance(saved, dict) else {}

    def save(self) -> None:
        """Replace the file in one rename (a reader never sees half of it)."""
        record = {
            "run_id": self.run_id,
            "mlflow_run_id": self.mlflow_run_id,
            "written": self.written,
            "keys": self.keys,
        }
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path)


class Tracker:
    """Rank 0's fan-out of logged values to the chosen backends, one run across requeues."""

    def __init__(
        self,
        names: list[str],
        run_dir: pathlib.Path,
        resume_step: int,
        params: Mapping[str, Any],
        project: str,
    ) -> None:
        check_backends(names)
        folder = run_dir / "tracking"
        folder.mkdir(parents=True, exist_ok=True)
        self.state = RunState(folder, project, resume_step)
        self.backends = [_start(_CLASSES[name], folder, self.state, params) for name in names]
        self.state.save()

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        """Numbers only (strings and lists are for metrics.jsonl); never a step twice."""
        numbers = {k: float(v) for k, v in values.items() if _is_number(v) and k != "step"}
        if not numbers:
            return
        for backend in self.backends:
            if backend.rewrites:
                backend.log(step, numbers)
                continue
            new = self.state.unwritten(backend.name, step, numbers)
            if new:
                self.state.save()  # before the write: a crash may lose a point, never double it
                backend.log(step, new)

    def close(self, ending: str = STOPPED) -> None:
        """Close every backend, telling it how this attempt ended (`ENDINGS`; unknown: stopped,
        which a later attempt may resume); one that fails to close is reported, the others
        still close."""
        for backend in self.backends:
            try:
                backend.close(ending)
            except Exception as err:  # a tracking library's own failure must not fail the run
                log.warning("closing %s failed: %s", backend.name, err)


def check_backends(names: list[str]) -> None:
    """Refuse a misspelled backend at start-up, naming the valid ones."""
    unknown = [name for name in names if name not in BACKENDS]
    if unknown:
        raise ConfigError(
            f"tracking.backends has {unknown[0]!r}, which is not one of {list(BACKENDS)}. "
            "HINT: e.g. tracking.backends=[tensorboard]."
        )


def _start(cls: type[Backend], folder: pathlib.Path, state: RunState, params: Any) -> Backend:
    try:
        return cls(folder, state, params)
    except ImportError:
        raise ConfigError(
            f"tracking.backends includes {cls.name}, which is not installed. HINT: pip install "
            f"'hpcddp[tracking]' (or pip install {_EXTRA[cls.name]})."
        ) from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _flat(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 0.1}}`` -> ``{"optim.lr": 0.1}``."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
