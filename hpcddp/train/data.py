"""Sharded, resumable data loading: each rank sees its own part, in an order fixed by the seed.

Exact resume needs two things the usual tutorial loop lacks: the loader must be able to start
part-way through an epoch, and creating its iterator must not draw from the global RNG (a
DataLoader without ``generator=`` does, and the weights then drift after a resume).
"""

import logging
import os
from collections.abc import Iterator, Mapping, Set, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from hpcddp.config import DataConfig
from hpcddp.errors import ConfigError
from hpcddp.launch import cpus
from hpcddp.launch.cpus import default_workers
from hpcddp.launch.distenv import DistEnv
from hpcddp.train.batches import tensors_in

log = logging.getLogger(__name__)


def split_datasets(made: Any) -> tuple[Any, Any]:
    """A dataset factory returns ``train`` or ``(train, eval)`` or ``{"train":..., "eval":...}``."""
    if isinstance(made, dict):
        train, evaluation = made["train"], made.get("eval")
    elif isinstance(made, (tuple, list)):
        train, evaluation = made[0], made[1] if len(made) > 1 else None
    else:
        train, evaluation = made, None
    refuse_empty_eval(evaluation)
    return train, evaluation


def refuse_empty_eval(eval_set: Any) -> None:
    """An empty eval set would report 0.0 metrics as if measured: refuse it at start-up."""
    if eval_set is not None and hasattr(eval_set, "__len__") and len(eval_set) == 0:
        raise ConfigError(
            "the eval set returned by data.factory is empty, so no metric could be measured. "
            "HINT: give it samples, or return only the training set to train without eval."
        )


class ResumableSampler(Sampler[int]):
    """DistributedSampler's order, resumable from a global position at any world size.

    An epoch is one permutation of the dataset (seeded by ``seed + epoch``, as
    DistributedSampler's, whatever the world size); rank r takes positions r, r+W, ... of
    what is left of it. After every rank has drawn k samples the ranks together have drawn
    exactly the first k*W positions, so where an epoch stands is one global number, samples
    consumed: a run resumed on another number of ranks takes the rest of the permutation, each
    sample once. From position 0 (and from any position at the same world size) the order,
    padding and drop_last trimming are DistributedSampler's own, so runs stay bitwise equal.
    """

    def __init__(
        self, dataset: Dataset[Any], env: DistEnv, *, shuffle: bool, seed: int, drop_last: bool
    ) -> None:
        self.size = len(_sized(dataset))
        self.world, self.rank = env.world_size, env.rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = self.consumed = 0

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Reshuffle for ``epoch`` (as every rank must) and begin after ``consumed`` samples of
        it, counted over all ranks."""
        self.epoch, self.consumed = epoch, consumed

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.size, generator=generator).tolist()

    def _rest(self, order: list[int]) -> list[int]:
        """What is left of the epoch, trimmed or padded (from the epoch's head) to W shares."""
        rest = order[self.consumed :]
        if self.drop_last:
            return rest[: len(rest) // self.world * self.world]
        pad = -len(rest) % self.world
        if pad and order:
            rest += (order * (pad // len(order) + 1))[:pad]
        return rest

    def __iter__(self) -> Iterator[int]:
        return iter(self._rest(self._order())[self.rank :: self.world])

    def __len__(self) -> int:
        left = max(self.size - self.consumed, 0)
        shares = left // self.world if self.drop_last else -(-left // self.world)
        return shares

    @property
    def num_samples(self) -> int:
        """Samples each rank draws in a whole epoch."""
        if self.drop_last:
            return self.size // self.world
        return -(-self.size // self.world)


class EvalShard(Sampler[int]):
    """Rank r takes samples r, r+W, ...: no padding, so reduced metrics count each sample once."""

    def __init__(self, dataset: Dataset[Any], env: DistEnv) -> None:
        self.indices = range(env.rank, len(_sized(dataset)), env.world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def default_num_workers(
    env: DistEnv, environ: Mapping[str, str] | None = None, allowed: Set[int] | None = None
) -> int:
    """Workers per rank from the CPUs this rank was given (`hpcddp.launch.cpus.default_workers`):
    its CPU binding (after pinning near its GPU), never more than its share of --cpus-per-task.
    """
    environ = os.environ if environ is None else environ
    return default_workers(env, environ, cpus.allowed_cpus() if allowed is None else allowed)


def samples_device(dataset: Dataset[Any]) -> str:
    """The device the dataset's samples already live on ("" for host memory), from its first.

    A small dataset is often put on the GPU whole. Its tensors cannot be pinned (the loader's
    pin thread fails on them), and loader workers forked after CUDA started cannot use CUDA.
    A first sample that cannot be read says nothing here: the loader will raise its error.
    """
    if not isinstance(dataset, Sized) or len(dataset) == 0:
        return ""
    try:
        sample = dataset[0]
    except Exception:  # the user's own __getitem__: its error belongs to the loader's first batch
        return ""
    device = next((t.device for t in tensors_in(sample) if t.device.type != "cpu"), None)
    return str(device) if device is not None else ""


def loading(dataset: Dataset[Any], workers: int, env: DistEnv) -> tuple[int, bool, str]:
    """Loader workers and pinning for ``dataset`` on this rank, and the device its samples are
    already on ("": none; then neither workers nor pinning)."""
    on = samples_device(dataset)
    if on:
        return 0, False, on
    return workers, env.device.startswith("cuda"), ""


def make_train_loader(
    dataset: Dataset[Any], cfg: DataConfig, env: DistEnv, seed: int
) -> DataLoader[Any]:
    """The training loader: resumable sampler, own generator, workers kept between epochs."""
    wanted = cfg.num_workers if cfg.num_workers >= 0 else default_num_workers(env)
    workers, pin, on = loading(dataset, wanted, env)
    if on:
        log.info(
            "the dataset's samples are already on %s: no pinned memory and no loader workers "
            "(device tensors cannot be pinned, and workers cannot use CUDA)",
            on,
        )
    sampler = ResumableSampler(
        dataset, env, shuffle=cfg.shuffle, seed=seed, drop_last=cfg.drop_last
    )
    return DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin,
        persistent_workers=workers > 0,
        drop_last=cfg.drop_last,
        generator=torch.Generator().manual_seed(seed),
    )


def make_eval_loader(dataset: Dataset[Any], cfg: DataConfig, env: DistEnv) -> DataLoader[Any]:
    """The evaluation loader: each sample on exactly one rank, no shuffling, no workers kept."""
    # its own generator: creating an iterator must not draw from the global RNG
    return DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=EvalShard(dataset, env),
        pin_memory=loading(dataset, 0, env)[1],
        generator=torch.Generator(),
    )


def start_epoch(
    loader: DataLoader[Any], epoch: int, seed: int, skip_batches: int = 0, before: int = 0
) -> None:
    """Position the loader at ``epoch`` after ``before`` samples (counted over all ranks,
    `hpcddp.train.state.Progress.samples_before`) and then ``skip_batches`` batches of each
    rank, identically on resume."""
    sampler, batch_size, generator = loader.sampler, loader.batch_size, loader.generator
    if not isinstance(sampler, ResumableSampler) or batch_size is None or generator is None:
        raise TypeError("start_epoch needs a loader made by make_train_loader")
    sampler.set_epoch(epoch, consumed=before + skip_batches * batch_size * sampler.world)
    generator.manual_seed(seed * 100003 + epoch)


def samples_per_rank(loader: DataLoader[Any]) -> int:
    """How many training samples each rank draws per epoch (the same on every rank)."""
    sampler = loader.sampler
    if not isinstance(sampler, ResumableSampler):
        raise TypeError("samples_per_rank needs a loader made by make_train_loader")
    return sampler.num_samples


def _sized(dataset: Dataset[Any]) -> Sized:
    """A map-style dataset, which has a length (iterable datasets cannot be sharded by index)."""
    if not isinstance(dataset, Sized):
        raise TypeError(f"{type(dataset).__name__} has no len(); a map-style dataset is needed")
    return dataset
