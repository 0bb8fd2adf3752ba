"""Every rank's side of saving and resuming the whole training state.

Each rank contributes its RNG states, rank 0 writes one file (`hpcddp.storage.checkpoint`),
and every rank learns at once if the write failed. On resume every rank loads the same
checkpoint and checks that it fits this run, so a resumed run continues bit for bit.
"""

import dataclasses
import logging
import pathlib
from typing import Any

import torch

from hpcddp.dist import collectives
from hpcddp.errors import ConfigError, DistributedError
from hpcddp.launch.distenv import DistEnv
from hpcddp.storage.checkpoint import CheckpointStore
from hpcddp.train import rng
from hpcddp.train.state import Progress

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Trained:
    """The objects whose state a checkpoint holds."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: "torch.amp.GradScaler | None"


class Checkpointer:
    """Saves and resumes `Trained` state in a run directory's `CheckpointStore`."""

    def __init__(self, run_dir: pathlib.Path, keep_last: int, env: DistEnv, trained: Trained):
        self.store = CheckpointStore(run_dir, keep_last=keep_last)
        self.run_dir, self.env, self.trained = run_dir, env, trained

    def save(self, progress: Progress, epoch_done: bool) -> None:
        """Every rank contributes its RNG state; rank 0 writes; every rank learns if it failed."""
        rng_states = collectives.gather_object(rng.capture())  # on rank 0 only
        collectives.on_rank_zero(
            lambda: self.store.save(progress.step, self._state(progress, rng_states, epoch_done)),
            self.env.rank,
            "save a checkpoint",
        )

    def _state(
        self, progress: Progress, rng_states: list[Any] | None, epoch_done: bool
    ) -> dict[str, Any]:
        """Everything exact resume needs, as weights_only-loadable data."""
        saved = dataclasses.replace(progress)
        if epoch_done:  # the checkpoint resumes at the start of the next epoch
            saved.epoch, saved.batch = saved.epoch + 1, 0
        t = self.trained
        return {
            "model": t.model.state_dict(),
            "optimizer": t.optimizer.state_dict(),
            "scheduler": t.scheduler.state_dict(),
            "scaler": t.scaler.state_dict() if t.scaler else {},
            "progress": dataclasses.asdict(saved),
            "rng": rng_states,
            "world_size": self.env.world_size,
        }

    def resume(self) -> Progress | None:
        """Load the latest complete checkpoint, if any, exactly as it was saved."""
        found = self.store.load_latest(map_location="cpu")
        steps = collectives.all_gather_object(found[0] if found else None)
        if len(set(steps)) > 1:
            raise DistributedError(
                f"ranks see different latest checkpoints {steps}. HINT: "
                "run.dir must be on a file system every node shares."
            )
        if not found:
            return None
        step, state = found
        if state["world_size"] != self.env.world_size:
            raise ConfigError(
                f"the checkpoint at step {step} in {self.run_dir} was written by "
                f"{state['world_size']} ranks, this run has {self.env.world_size}; exact resume "
                "needs the same world size. HINT: relaunch with the original number of tasks, "
                "or choose a new run.dir."
            )
        t = self.trained
        t.model.load_state_dict(state["model"])
        t.optimizer.load_state_dict(state["optimizer"])
        t.scheduler.load_state_dict(state["scheduler"])
        if t.scaler and state["scaler"]:
            t.scaler.load_state_dict(state["scaler"])
        rng.restore(state["rng"][self.env.rank])
        progress = Progress(**state["progress"])
        log.info("resumed from step %d (epoch %d, batch %d)", step, progress.epoch, progress.batch)
        return progress
