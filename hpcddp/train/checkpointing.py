"""Every rank's side of saving and resuming the whole training state.

Saving: each rank contributes its RNG states; rank 0 copies the state to host memory
(`hpcddp.storage.snapshot`, the only part the loop waits for) and writes it in a background
thread (`hpcddp.storage.checkpoint`: temp file, hash while writing, fsync, rename). The next
save, a stop and the end of training first wait for that write; its failure reaches every rank
then, as the same error. The ranks that wait for rank 0 wait on the side group with a timeout
that fits the checkpoint's size (`hpcddp.comm.waiting`), never tripping ``dist.timeout_s``.

Resuming (`hpcddp.train.whole_resume`): the newest checkpoint every node verifies, read once
per node into place, the rest copied from the page cache; a checkpoint of another world size or
a sharded one resumes too.
"""

import concurrent.futures
import dataclasses
import logging
import pathlib
import time
from typing import Any

import torch

from hpcddp.comm import collectives, waiting
from hpcddp.comm.sidegroup import side_group
from hpcddp.config import Config
from hpcddp.launch.distenv import DistEnv
from hpcddp.storage.checkpoint import CheckpointStore
from hpcddp.storage.snapshot import Snapshot
from hpcddp.train import preemption, rng, write_in_flight
from hpcddp.train.state import Progress
from hpcddp.train.whole_resume import WholeResume

log = logging.getLogger(__name__)
_COPIED = (
    "checkpoint step %d: %.1f MB copied to host memory in %.3f s (%.1f MB pinned), "
    "written in background"
)


@dataclasses.dataclass
class Trained:
    """The objects whose state a checkpoint holds."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: "torch.amp.GradScaler | None"

    def state_bytes(self) -> int:
        """A bound on the checkpoint's size: weights, buffers and up to two optimizer moments."""
        weights = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
        return 3 * weights


class Checkpointer:
    """Saves and resumes `Trained` state in a run directory's `CheckpointStore`."""

    def __init__(
        self,
        run_dir: pathlib.Path,
        cfg: Config,
        env: DistEnv,
        trained: Trained,
    ) -> None:
        """``cfg``: train's saving, dist's timeout, and the batch and seed a checkpoint records
        so that a resume at another world size keeps the global batch and reseeds."""
        train, timeout_s = cfg.train, cfg.dist.timeout_s
        self.shape = {"batch_size": cfg.data.batch_size, "grad_accum_steps": train.grad_accum_steps}
        self.seed = cfg.run.seed
        self.store = CheckpointStore(run_dir, keep_last=train.keep_checkpoints)
        self.run_dir, self.env, self.trained = run_dir, env, trained
        self.in_background = train.checkpoint_async
        self.snapshot = Snapshot()
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._writing: tuple[int, concurrent.futures.Future] | None = None
        self.wait_timeout_s = waiting.write_timeout_s(timeout_s, trained.state_bytes())

    def save(self, progress: Progress, epoch_done: bool) -> None:
        """Every rank contributes its RNG state; rank 0 writes; every rank learns if it failed."""
        # a second Ctrl-C meanwhile waits until the checkpoint is whole (`preemption.shielded`)
        with preemption.shielded(finish=self._finish_writing):
            rng_states = collectives.gather_object(rng.capture(self._device))  # on rank 0 only
            collectives.on_rank_zero(
                lambda: self._write(progress.step, self._state(progress, rng_states, epoch_done)),
                self.env.rank,
                "save a checkpoint",
                group=side_group(self.wait_timeout_s),
            )

    @property
    def _device(self) -> torch.device:
        return torch.device(self.env.device)

    def prepare(self) -> None:
        """Rank 0, once the optimizer has its state (after the first step): allocate the host
        buffers of the first background save on the writer thread, while training goes on."""
        if not (self.env.rank == 0 and self.in_background and self._writer is None):
            return
        t = self.trained
        shapes = {"model": t.model.state_dict(), "optimizer": t.optimizer.state_dict()}
        self._writer = concurrent.futures.ThreadPoolExecutor(1, "hpcddp-checkpoint")
        self._writing = (0, self._writer.submit(self.snapshot.prepare, shapes))

    def wait(self) -> None:
        """Until rank 0's background write is done; its failure is raised on every rank."""
        with preemption.shielded(finish=self._finish_writing):
            collectives.on_rank_zero(
                self._finish_writing,
                self.env.rank,
                "write a checkpoint",
                group=side_group(self.wait_timeout_s),
            )

    def _write(self, step: int, state: dict[str, Any]) -> None:
        """Rank 0: wait for the previous write, then write this one (in the background)."""
        self._finish_writing()
        if not self.in_background:
            self.store.save(step, state)
            return
        started = time.perf_counter()
        copy = self.snapshot.take(state)
        copied_s, snapshot = time.perf_counter() - started, self.snapshot
        log.info(_COPIED, step, snapshot.nbytes / 1e6, copied_s, snapshot.pinned_bytes / 1e6)
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, "hpcddp-checkpoint")
        self._writing = (step, self._writer.submit(self.store.save, step, copy))

    def _finish_writing(self) -> None:
        """Rank 0: wait for the write in flight, if any; raise what it raised."""
        writing, self._writing = self._writing, None
        write_in_flight.finish(writing)

    def _state(
        self, progress: Progress, rng_states: list[Any] | None, epoch_done: bool
    ) -> dict[str, Any]:
        """Everything exact resume needs, as weights_only-loadable data."""
        saved = dataclasses.replace(progress)
        if epoch_done:  # the checkpoint resumes at the start of the next epoch
            saved.next_epoch()
        t = self.trained
        return {
            "model": t.model.state_dict(),
            "optimizer": t.optimizer.state_dict(),
            "scheduler": t.scheduler.state_dict(),
            "scaler": t.scaler.state_dict() if t.scaler else {},
            "progress": dataclasses.asdict(saved),
            "rng": rng_states,
            "world_size": self.env.world_size,
            "data": self.shape,  # with world_size: the global batch a resume keeps
        }

    def resume(self) -> Progress | None:
        """Load the newest checkpoint every node verifies, exactly as it was saved
        (`hpcddp.train.whole_resume`)."""
        batch_size = self.shape["batch_size"]
        return WholeResume(
            self.store, self.run_dir, self.env, self.trained, self.seed, batch_size
        ).resume()
