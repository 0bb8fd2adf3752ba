"""Every rank's side of saving and resuming the whole training state.

Saving: each rank contributes its RNG states; rank 0 copies the state to host memory
(`hpcddp.storage.snapshot`, the only part the loop waits for) and writes it in a background
thread (`hpcddp.storage.checkpoint`: temp file, hash while writing, fsync, rename). The next
save, a stop and the end of training first wait for that write; its failure reaches every rank
then, as the same error. The ranks that wait for rank 0 wait on the side group with a timeout
that fits the checkpoint's size (`hpcddp.comm.waiting`), never tripping ``dist.timeout_s``.

Resuming: local rank 0 of each node verifies the newest checkpoint's digest in one read of the
file per node, which reads the weights straight into its model on the way where they fit
(`hpcddp.storage.into_place`); every rank maps the file and copies each other tensor where it
belongs from the node's page cache, letting go of the mapped pages as it goes
(`hpcddp.storage.mapped`), so a rank holds its training state plus one chunk. Only when
every node's check passed is the rest (optimizer, scheduler, RNG, progress) restored;
otherwise the next older one is tried. A checkpoint written at another world size resumes too
(`hpcddp.train.resharding`), and so does a sharded one written under ``dist.strategy=fsdp``
(`hpcddp.train.sharded_checkpointing`), each rank reading it whole.
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
from hpcddp.errors import CheckpointError, ConfigError, DistributedError, agreed
from hpcddp.launch.distenv import DistEnv
from hpcddp.storage import into_place, mapped
from hpcddp.storage.checkpoint import CheckpointStore
from hpcddp.storage.misfit import describe as misfit_of
from hpcddp.storage.snapshot import Snapshot
from hpcddp.train import preemption, resharding, rng, sharded_checkpointing
from hpcddp.train.state import Progress

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
        if self._writing is None:
            return
        step, future = self._writing
        self._writing = None
        if not future.done() and step:
            log.info("waiting for the checkpoint of step %d to be written", step)
        future.result()

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

    # -- resume ---------------------------------------------------------------------------

    def resume(self) -> Progress | None:
        """Load the newest checkpoint every node verifies, exactly as it was saved."""
        complete = resharding.complete(self.run_dir, self.store.keep_last)
        steps = collectives.all_gather_object(complete[-1][0] if complete else None)
        if len(set(steps)) > 1:
            raise DistributedError(
                f"ranks see different latest checkpoints {steps}. HINT: "
                "run.dir must be on a file system every node shares."
            )
        for step, path in reversed(complete):
            progress = self._try(step, path) if path.suffix == ".pt" else _sharded(self, path)
            if progress is not None:
                return progress
        if complete:
            raise CheckpointError(
                f"none of the {len(complete)} checkpoints in {self.store.directory} is usable "
                "(see warnings above); expected at least one that verifies. HINT: restore one "
                "from backup, or move the directory away to deliberately start from scratch."
            )
        return None

    def _try(self, step: int, path: pathlib.Path) -> Progress | None:
        """Resume from ``path`` if every node's check of it passes; None to try an older one.

        Local rank 0 of each node checks the digest on a helper thread, in one read that puts
        the weights it can straight into the model (`_in_place`); meanwhile every rank copies
        the others from the mapped file, through the node's page cache. Nothing else is
        restored before the verdict; a rejected file's weights are overwritten by the next's.
        """
        state = self._loadable(path)
        problem = None if state is not None else "it does not load safely"
        local_zero = self.env.local_rank == 0
        pieces = _in_place(path, self.trained.model, state) if local_zero else []
        planned = {piece.key for piece in pieces}
        with concurrent.futures.ThreadPoolExecutor(1, "hpcddp-verify") as pool:
            check = pool.submit(self.store.verify, path, pieces) if local_zero else None
            if state is not None:
                self._copy_weights(step, state["model"], done=planned)
            try:
                placed = check.result() if check is not None else True
            except CheckpointError as err:
                problem, placed = str(err), True
        if state is not None and not placed:  # an older digest: nothing was read in place
            self._copy_weights(step, state["model"], done=set(state["model"]) - planned)
        problems = [p for p in collectives.all_gather_object(problem) if p]
        if problems:
            log.warning("skipping checkpoint %s: %s", path, problems[0])
            return None
        assert state is not None  # every rank loaded it, or some rank had a problem
        return self._load_rest(step, state)

    def _copy_weights(self, step: int, weights: dict[str, Any], done: set[str]) -> None:
        """The checkpoint's weights into the model (those in ``done`` are there already), or
        one line on what does not fit.

        Every rank loads the same file into the same model, so every rank refuses alike.
        """
        target = self.trained.model.state_dict()
        if mapped.copy_into(target, weights, done):
            return
        misfit = misfit_of(target, weights)
        if misfit is None:  # same names and shapes, but not all tensors (a module's extra state)
            self.trained.model.load_state_dict(weights)
            return
        raise agreed(
            ConfigError(
                f"the checkpoint at step {step} in {self.run_dir} does not fit this model "
                f"({misfit}): it was saved by another model, or the model's code changed. "
                "HINT: choose a new run.dir for this model (its checkpoints are left as they are), "
                "or run the code that wrote them."
            )
        )

    def _loadable(self, path: pathlib.Path) -> dict[str, Any] | None:
        """The file, mapped; None if it will not unpickle safely (the same bytes, so the same
        verdict, on every rank)."""
        try:
            return self.store.load_verified(path)
        except CheckpointError as err:
            log.warning("cannot load checkpoint %s: %s", path, err)
            return None

    def _load_rest(self, step: int, state: dict[str, Any]) -> Progress:
        """Everything but the weights (already copied), from a verified checkpoint."""
        self.trained.optimizer.load_state_dict(mapped.materialize(state["optimizer"]))
        progress = resharding.restore_rest(
            state, self.trained, self.env, self.seed, self.shape["batch_size"]
        )
        log.info("resumed from step %d (epoch %d, batch %d)", step, progress.epoch, progress.batch)
        return progress


def _sharded(checkpointer: Checkpointer, path: pathlib.Path) -> Progress | None:
    """A checkpoint written under dist.strategy=fsdp, each rank reading it whole."""
    progress = sharded_checkpointing.try_sharded(
        path,
        checkpointer.trained,
        checkpointer.env,
        checkpointer.seed,
        checkpointer.shape["batch_size"],
    )
    if progress is not None:
        log.info("resumed from %s", path.name)
    return progress


def _in_place(
    path: pathlib.Path, model: torch.nn.Module, state: dict[str, Any] | None
) -> list[into_place.Piece]:
    """The weights to read straight into ``model``; none when the checkpoint's do not fit
    (`Checkpointer._copy_weights` then says how)."""
    weights = model.state_dict()
    if state is None or not mapped.fits(weights, state["model"]):
        return []
    return into_place.pieces(path, weights, state["model"])
