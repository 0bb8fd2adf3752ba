"""Every rank's side of sharded checkpoints (``dist.strategy=fsdp``), with the guarantees the
whole-state checkpoints give (`hpcddp.train.checkpointing`).

Saving: every rank copies its own shards of the model and optimizer to host buffers (the only
part the loop waits for, reused from save to save), then a background thread writes them with
torch.distributed.checkpoint over a process group of its own, so the write's collectives never
meet training's. DCP returns only after every rank's files are written and fsynced and the
metadata is durable; each rank then hashes the shard files it wrote (still on the thread,
from the page cache) and sends the digests to rank 0, which writes ``extras.pt`` and the
``COMPLETE`` marker with every file's digest (`hpcddp.storage.sharded`). The next save, a
stop and the end of training first wait for the write on every rank; a failure on any rank
reaches every rank then, as one error.

Resuming: the newest complete checkpoint, whole or sharded, whichever world size and strategy
wrote it: DCP reads each rank's slice of a sharded one, each file it touches read once and
checked against its digest (`hpcddp.storage.sharded_reader`), and a whole one (ddp's) is
loaded and each rank keeps its slice. A checkpoint any rank cannot use (torn, truncated, a
digest that fails) is skipped for the next older one.
"""

import concurrent.futures
import dataclasses
import io
import logging
import pathlib
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.api import CheckpointException

from hpcddp.comm import collectives, waiting
from hpcddp.comm.sidegroup import side_group
from hpcddp.config import Config
from hpcddp.errors import CheckpointError
from hpcddp.launch.distenv import DistEnv
from hpcddp.storage import atomic, mapped, sharded
from hpcddp.storage.checkpoint import CheckpointStore
from hpcddp.storage.sharded import EXTRAS, ShardedStore
from hpcddp.train import preemption, resharding, rng, sharded_state, write_in_flight
from hpcddp.train.state import Progress

log = logging.getLogger(__name__)


class ShardedCheckpointer:
    """Saves and resumes the training state as every rank's shards; the loop's four calls."""

    def __init__(self, run_dir: pathlib.Path, cfg: Config, env: DistEnv, trained: Any) -> None:
        self.run_dir, self.env, self.trained = run_dir, env, trained
        self.store = ShardedStore(run_dir, keep_last=cfg.train.keep_checkpoints)
        self.shape = {
            "batch_size": cfg.data.batch_size,
            "grad_accum_steps": cfg.train.grad_accum_steps,
        }
        self.seed = cfg.run.seed
        self.in_background = cfg.train.checkpoint_async
        # a rank's shards: the whole state over the ranks, with room for slow disks
        self.wait_timeout_s = waiting.write_timeout_s(
            cfg.dist.timeout_s, trained.state_bytes() // max(env.world_size, 1)
        )
        self.group = _own_group(self.wait_timeout_s)  # a collective: every rank, here
        self._staged: dict[str, Any] | None = None
        self._writer = concurrent.futures.ThreadPoolExecutor(1, "hpcddp-sharded-checkpoint")
        self._writing: tuple[int, concurrent.futures.Future] | None = None

    def prepare(self) -> None:
        """Once the optimizer has its state (after the first step): allocate the host buffers
        of the first save on the writer thread, while training goes on."""
        if self._staged is not None or self._writing is not None:
            return
        state = sharded_state.named(self.trained.model, self.trained.optimizer)
        self._writing = (0, self._writer.submit(self._allocate, state))

    def _allocate(self, state: dict[str, Any]) -> None:
        pinned = self.env.device.startswith("cuda")
        self._staged = _create_cpu_state_dict(state, pin_memory=pinned)

    def save(self, progress: Progress, epoch_done: bool) -> None:
        """Every rank stages its shards; the write goes on in the background (or not)."""
        with preemption.shielded(finish=self._finish_writing):
            self.wait()
            step = progress.step
            rng_states = collectives.gather_object(rng.capture(torch.device(self.env.device)))
            extras = self._extras(progress, rng_states, epoch_done) if self.env.rank == 0 else None
            collectives.on_rank_zero(
                lambda: self.store.open(step), self.env.rank, "open a sharded checkpoint"
            )
            started = time.perf_counter()
            staged = self._stage()
            log.info(
                "checkpoint step %d: this rank's shards staged in %.3f s",
                step,
                time.perf_counter() - started,
            )
            self._writing = (step, self._writer.submit(self._write, step, staged, extras))
            if not self.in_background:
                self.wait()

    def wait(self) -> None:
        """Until every rank's write (and rank 0's marker) is done; any rank's failure is
        raised on every rank."""
        with preemption.shielded(finish=self._finish_writing):
            problem = None
            try:
                self._finish_writing()
            except Exception as err:  # told to every rank below, then raised on each
                problem = f"{type(err).__name__}: {err}"
                log.error("sharded checkpoint write failed on this rank: %s", problem)
            problems = _all_gather(problem, side_group(self.wait_timeout_s))
            failed = [(r, p) for r, p in enumerate(problems) if p]
            if failed:
                rank, text = failed[0]
                raise CheckpointError(
                    f"the sharded checkpoint write failed on rank {rank}: {text}; earlier "
                    "checkpoints are intact. HINT: check that run.dir is writable and has room."
                )

    def _finish_writing(self) -> None:
        """This rank's write in flight, if any; raise what it raised."""
        writing, self._writing = self._writing, None
        write_in_flight.finish(writing)

    def _stage(self) -> dict[str, Any]:
        """This rank's shards copied to host buffers made at the first save."""
        state = sharded_state.named(self.trained.model, self.trained.optimizer)
        if self._staged is None:  # a save before the first step's prepare
            self._allocate(state)
        assert self._staged is not None
        staged = _copy_state_dict(state, self._staged, non_blocking=False)
        return staged

    def _write(self, step: int, staged: dict[str, Any], extras: dict[str, Any] | None) -> None:
        """In the background: every rank's shards and their digests, then (rank 0) the extras
        and the marker, which records every file's digest."""
        path = self.store.path_for(step)
        started = time.perf_counter()
        dcp.save(staged, checkpoint_id=path, process_group=self.group)
        mine, problem = {}, None
        try:
            mine = sharded.digests_of(path, _own_shards(path, self.group))
        except OSError as err:  # told to rank 0 too, which must not wait for it
            problem = f"rank {self.env.rank} could not hash its shards: {err}"
        everyone = _gather_to_zero((mine, problem), self.group)
        problems = [p for _, p in everyone if p] or ([problem] if problem else [])
        if problems:
            raise CheckpointError(f"{problems[0]}; this checkpoint is not marked complete")
        if extras is None:
            return
        buffer = io.BytesIO()
        torch.save(extras, buffer)
        atomic.atomic_write_bytes(path / EXTRAS, buffer.getvalue())
        meta = {"world_size": self.env.world_size, "strategy": "fsdp", **self.shape}
        self.store.complete(step, meta, {k: v for d, _ in everyone for k, v in d.items()})
        log.info("saved sharded checkpoint %s in %.2f s", path, time.perf_counter() - started)

    def _extras(
        self, progress: Progress, rng_states: list[Any] | None, epoch_done: bool
    ) -> dict[str, Any]:
        """Everything but the shards that exact resume needs (rank 0)."""
        saved = dataclasses.replace(progress)
        if epoch_done:
            saved.next_epoch()
        t = self.trained
        return {
            "scheduler": t.scheduler.state_dict(),
            "scaler": t.scaler.state_dict() if t.scaler else {},
            "progress": dataclasses.asdict(saved),
            "rng": rng_states,
            "world_size": self.env.world_size,
            "strategy": "fsdp",
            "data": self.shape,
        }

    # -- resume ---------------------------------------------------------------------------

    def resume(self) -> Progress | None:
        """Load the newest checkpoint every rank can use, sharded or whole."""
        return resharding.newest_usable(self.run_dir, self.store.keep_last, self._load)

    def _load(self, step: int, path: pathlib.Path) -> Progress | None:
        """A sharded checkpoint (each rank reads its slice) or a whole one (ddp's)."""
        batch_size = self.shape["batch_size"]
        if path.suffix == ".dcp":
            progress = try_sharded(path, self.trained, self.env, self.seed, batch_size)
        else:
            progress = self._try_whole(path)
        if progress is not None:
            log.info("resumed from step %d (%s)", step, path.name)
        return progress

    def _try_whole(self, path: pathlib.Path) -> Progress | None:
        """A ddp checkpoint (whole tensors) into the sharded model: each rank keeps its slice."""
        whole = CheckpointStore(self.run_dir)
        problem, state = None, None
        try:
            if self.env.local_rank == 0:
                whole.verify(path)
            state = whole.load_verified(path)
        except CheckpointError as err:
            problem = str(err)
        if _refused(path, problem):
            return None
        assert state is not None
        t = self.trained
        sharded_state.load_whole(mapped.materialize(state), t.model, t.optimizer)
        return resharding.restore_rest(state, t, self.env, self.seed, self.shape["batch_size"])


def try_sharded(
    path: pathlib.Path, trained: Any, env: DistEnv, seed: int, batch_size: int
) -> Progress | None:
    """Resume from the sharded checkpoint ``path`` (any world size, into a sharded or a whole
    model); None, on every rank alike, when any rank cannot use it."""
    problem, extras, digests = None, None, None
    try:
        record = ShardedStore(path.parent.parent).check(path)
        digests = record.get("digests")  # none: written before digests, sizes checked alone
        for small in (".metadata", EXTRAS):  # each rank reads both whole: checked first, for
            sharded.verify_file(path / small, record)  # a clear message (0.2 MB, cached)
        extras = torch.load(path / EXTRAS, map_location="cpu", weights_only=True)
    except Exception as err:  # unreadable in any way: fall back to an older one
        problem = f"{type(err).__name__}: {err}"
    if _refused(path, problem):
        return None
    try:
        sharded_state.load_sharded(path, trained.model, trained.optimizer, digests)
    except (Exception, CheckpointException) as err:  # DCP's tells every rank of any failure
        problem = _first_cause(err)
    if _refused(path, problem):
        return None
    assert extras is not None
    return resharding.restore_rest(extras, trained, env, seed, batch_size)


def _first_cause(err: BaseException) -> str:
    """One line for a failed load: the first rank's own error where DCP wraps them (which
    file's digest failed, on the rank that read it), else the error itself."""
    if isinstance(err, CheckpointException):  # {rank: (exception, traceback)}
        for rank, (cause, _) in sorted(err.failures.items()):
            return f"rank {rank}: {type(cause).__name__}: {cause}"
    return f"{type(err).__name__}: {err}"


def _refused(path: pathlib.Path, problem: str | None) -> bool:
    """Whether any rank had a problem with ``path`` (every rank gets the same answer)."""
    problems = [p for p in collectives.all_gather_object(problem) if p]
    if problems:
        log.warning("skipping checkpoint %s: %s", path, problems[0])
    return bool(problems)


def _own_group(timeout_s: float) -> "dist.ProcessGroup | None":
    """A gloo group for the background writes (DCP's plan and metadata exchanges)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    import datetime

    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def _own_shards(path: pathlib.Path, group: Any) -> list[str]:
    """The shard files this rank wrote: DCP names them ``__<rank in the group>_<n>.distcp``."""
    rank = dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0
    return sorted(p.name for p in path.glob(f"__{rank}_*.distcp"))


def _gather_to_zero(obj: Any, group: Any) -> list[Any]:
    """Every rank's ``obj`` on rank 0 of ``group`` (others get [])."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0, group=group)
    return out or []


def _all_gather(obj: Any, group: Any) -> list[Any]:
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out


__all__ = ["ShardedCheckpointer", "try_sharded"]
