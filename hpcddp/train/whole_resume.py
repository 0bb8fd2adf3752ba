"""Resuming the whole training state from the newest checkpoint every node verifies.

Local rank 0 of each node verifies the newest checkpoint's digest in one read of the file per
node, which reads the weights straight into its model on the way where they fit
(`hpcddp.storage.into_place`); every rank maps the file and copies each other tensor where it
belongs from the node's page cache, letting go of the mapped pages as it goes
(`hpcddp.storage.mapped`), so a rank holds its training state plus one chunk. Only when every
node's check passed is the rest (optimizer, scheduler, RNG, progress) restored; otherwise the
next older one is tried. A checkpoint written at another world size resumes too
(`hpcddp.train.resharding`), and so does a sharded one written under ``dist.strategy=fsdp``
(`hpcddp.train.sharded_checkpointing`), each rank reading it whole.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import pathlib
from typing import TYPE_CHECKING, Any

import torch

from hpcddp.comm import collectives
from hpcddp.errors import CheckpointError, ConfigError, agreed
from hpcddp.launch.distenv import DistEnv
from hpcddp.storage import into_place, mapped
from hpcddp.storage.checkpoint import CheckpointStore
from hpcddp.storage.misfit import describe as misfit_of
from hpcddp.train import resharding, sharded_checkpointing
from hpcddp.train.state import Progress

if TYPE_CHECKING:
    from hpcddp.train.checkpointing import Trained

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WholeResume:
    """One resume: the store to read, and what a checkpoint is loaded into."""

    store: CheckpointStore
    run_dir: pathlib.Path
    env: DistEnv
    trained: Trained
    seed: int  # a resume at another world size reseeds from it
    batch_size: int  # with the checkpoint's world size: the global batch a resume keeps

    def resume(self) -> Progress | None:
        """Load the newest checkpoint every node verifies, exactly as it was saved."""
        return resharding.newest_usable(self.run_dir, self.store.keep_last, self._load)

    def _load(self, step: int, path: pathlib.Path) -> Progress | None:
        """A whole checkpoint (ddp's) or a sharded one (fsdp's), each rank reading it whole."""
        return self._try(step, path) if path.suffix == ".pt" else _sharded(self, path)

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
            state, self.trained, self.env, self.seed, self.batch_size
        )
        log.info("resumed from step %d (epoch %d, batch %d)", step, progress.epoch, progress.batch)
        return progress


def _sharded(checkpointer: WholeResume, path: pathlib.Path) -> Progress | None:
    """A checkpoint written under dist.strategy=fsdp, each rank reading it whole."""
    progress = sharded_checkpointing.try_sharded(
        path,
        checkpointer.trained,
        checkpointer.env,
        checkpointer.seed,
        checkpointer.batch_size,
    )
    if progress is not None:
        log.info("resumed from %s", path.name)
    return progress


def _in_place(
    path: pathlib.Path, model: torch.nn.Module, state: dict[str, Any] | None
) -> list[into_place.Piece]:
    """The weights to read straight into ``model``; none when the checkpoint's do not fit
    (`WholeResume._copy_weights` then says how)."""
    weights = model.state_dict()
    if state is None or not mapped.fits(weights, state["model"]):
        return []
    return into_place.pieces(path, weights, state["model"])
