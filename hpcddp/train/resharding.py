"""Resuming at another world size or strategy: the global batch kept, the data position global.

A checkpoint records the world size, micro-batch size and accumulation that wrote it. A run
resumed on M ranks keeps the global batch (micro-batch x ranks x accumulation) by changing
``train.grad_accum_steps``, or refuses with the sizes that would work; it takes the rest of the
interrupted epoch from the global position (`hpcddp.train.data.ResumableSampler`), so each
remaining sample is trained on once. Each rank's random streams cannot be carried to another
number of ranks: they are seeded afresh from the seed, the rank and the step.
"""

import dataclasses
import logging
import pathlib
from collections.abc import Callable
from typing import Any

import torch

from hpcddp.comm import collectives
from hpcddp.config import Config
from hpcddp.errors import CheckpointError, ConfigError, DistributedError, agreed
from hpcddp.launch.distenv import DistEnv
from hpcddp.storage import mapped
from hpcddp.storage.checkpoint import CheckpointStore
from hpcddp.storage.sharded import ShardedStore
from hpcddp.train import rng
from hpcddp.train.state import Progress

log = logging.getLogger(__name__)


def complete(run_dir: pathlib.Path, keep_last: int = 3) -> list[tuple[int, pathlib.Path]]:
    """Every complete checkpoint of the run, whole (``.pt``) or sharded (``.dcp``), oldest
    first; at a step that has both, the newer write wins (the sharded one: fsdp came later)."""
    by_step = dict(CheckpointStore(run_dir, keep_last).list_complete())
    by_step.update(ShardedStore(run_dir, keep_last).list_complete())
    return sorted(by_step.items())


def newest_usable(
    run_dir: pathlib.Path,
    keep_last: int,
    load: Callable[[int, pathlib.Path], Progress | None],
) -> Progress | None:
    """Resume from the newest complete checkpoint that ``load`` takes (None from ``load``: every
    rank alike could not use it, so the next older one is tried); None when there is none.

    Every strategy's resume goes through here, so a run never starts over while a checkpoint
    exists: when none of them is usable it is an error, not a fresh start."""
    found = complete(run_dir, keep_last)
    steps = collectives.all_gather_object(found[-1][0] if found else None)
    if len(set(steps)) > 1:
        raise DistributedError(
            f"ranks see different latest checkpoints {steps}. HINT: "
            "run.dir must be on a file system every node shares."
        )
    for step, path in reversed(found):
        progress = load(step, path)
        if progress is not None:
            return progress
    if found:
        raise CheckpointError(
            f"none of the {len(found)} checkpoints in {found[-1][1].parent} is usable "
            "(see warnings above); expected at least one that verifies. HINT: restore one "
            "from backup, or move the directory away to deliberately start from scratch."
        )
    return None


def shape_of(path: pathlib.Path) -> dict[str, Any]:
    """World size, strategy, micro-batch and accumulation that wrote a checkpoint ({} when
    unreadable, or a sharded one whose files are not all there with their sizes: resume
    skips it, and says why)."""
    try:
        if path.suffix == ".dcp":
            return ShardedStore(path.parent.parent).check(path)
        state = mapped.load(path)
        return {"world_size": state["world_size"], "strategy": "ddp", **state.get("data", {})}
    except Exception as exc:  # unreadable now is unusable later: resume explains
        log.warning("cannot read how checkpoint %s was written: %s", path, exc)
        return {}


def keep_global_batch(cfg: Config, env: DistEnv, run_dir: pathlib.Path) -> Config:
    """``cfg`` with the accumulation that keeps the global batch of the checkpoint resume will
    load at this world size (itself when nothing changed); a refusal, with sizes that work,
    when none can. That checkpoint is the newest whose shape can be read (and, if sharded,
    whose files are all there): resume skips the others the same way."""
    step, shape = _newest_readable(complete(run_dir, cfg.train.keep_checkpoints))
    if "world_size" not in shape:
        return cfg
    micro = shape.get("batch_size", cfg.data.batch_size)
    accum = shape.get("grad_accum_steps", cfg.train.grad_accum_steps)
    wanted = micro * shape["world_size"] * accum
    per_window = cfg.data.batch_size * env.world_size
    if wanted == per_window * cfg.train.grad_accum_steps:
        return cfg
    if wanted % per_window:
        raise agreed(ConfigError(_no_fit(step, shape, wanted, cfg, env)))
    steps = wanted // per_window
    log.info(
        "resuming a checkpoint of %d ranks on %d: train.grad_accum_steps %d -> %d keeps the "
        "global batch of %d samples",
        shape["world_size"],
        env.world_size,
        cfg.train.grad_accum_steps,
        steps,
        wanted,
    )
    train = dataclasses.replace(cfg.train, grad_accum_steps=steps)
    return dataclasses.replace(cfg, train=train)


def _newest_readable(found: list[tuple[int, pathlib.Path]]) -> tuple[int, dict[str, Any]]:
    """(step, shape) of the newest checkpoint in ``found`` whose shape reads; (0, {}) if none."""
    for step, path in reversed(found):
        shape = shape_of(path)
        if "world_size" in shape:
            return step, shape
    return 0, {}


def _no_fit(step: int, shape: dict[str, Any], wanted: int, cfg: Config, env: DistEnv) -> str:
    world, micro = env.world_size, cfg.data.batch_size
    sizes = [b for b in range(1, 2 * micro + 1) if wanted % (b * world) == 0]
    worlds = [w for w in range(1, 2 * world + 1) if wanted % (micro * w) == 0]
    fixes = [f"run on one of {worlds} ranks"] if worlds else []
    if sizes:
        fixes.append(f"set data.batch_size to one of {sizes} (accumulation follows)")
    return (
        f"the checkpoint at step {step} was written by {shape['world_size']} ranks with a "
        f"global batch of {wanted} samples; {world} ranks with data.batch_size={micro} cannot "
        f"make it ({wanted} is not a multiple of {micro * world}). HINT: "
        f"{', or '.join(fixes) or 'choose a new run.dir'}."
    )


def restore_rest(
    saved: dict[str, Any], trained: Any, env: DistEnv, seed: int, batch_size: int
) -> Progress:
    """Scheduler, scaler, progress and RNG of a checkpoint whose weights are loaded.

    At the world size that wrote it, everything is as it was; at another, the epoch resumes
    from its global position and each rank's random streams are seeded afresh.
    """
    trained.scheduler.load_state_dict(saved["scheduler"])
    if trained.scaler and saved["scaler"]:
        trained.scaler.load_state_dict(saved["scaler"])
    progress = Progress(**saved["progress"])
    device = torch.device(env.device)
    if saved["world_size"] == env.world_size:
        own = mapped.materialize(saved["rng"][env.rank])
        rng.restore(own, device, env.local_rank)
        return progress
    micro = saved.get("data", {}).get("batch_size", batch_size)
    at = progress.epoch_position(micro, saved["world_size"])
    progress.samples_before, progress.batch = at, 0
    rng.seed_everything(seed + env.rank + 1_000_003 * progress.step)
    log.info(
        "resumed on %d ranks from %d: epoch %d continues after %d samples",
        env.world_size,
        saved["world_size"],
        progress.epoch,
        at,
    )
    return progress
