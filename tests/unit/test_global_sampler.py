"""The training sampler's position is global: samples consumed over all ranks, any world size.

From the start of an epoch (or from a position reached at the same world size) it must hand
every rank exactly what DistributedSampler does, or resumed and uninterrupted runs would
drift; resumed on another number of ranks, the rest of the epoch must be seen once each.
"""

import collections

import pytest
from torch.utils.data import DistributedSampler

from hpcddp.launch.distenv import DistEnv
from hpcddp.train.data import ResumableSampler


def _env(rank: int, world: int) -> DistEnv:
    return DistEnv(rank, rank, world, world, 0, 1, "127.0.0.1", 29500, "local", "")


def _sampler(size: int, rank: int, world: int, drop_last: bool, shuffle: bool = True):
    return ResumableSampler(
        range(size), _env(rank, world), shuffle=shuffle, seed=3, drop_last=drop_last
    )


@pytest.mark.parametrize("size", [24, 25, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_same_order_as_distributed_sampler(size, drop_last, shuffle):
    for rank in range(4):
        ours = _sampler(size, rank, 4, drop_last, shuffle)
        theirs = DistributedSampler(
            range(size), num_replicas=4, rank=rank, shuffle=shuffle, seed=3, drop_last=drop_last
        )
        for epoch in (0, 1):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs) == ours.num_samples


@pytest.mark.parametrize("drop_last", [False, True])
def test_same_world_resume_continues_each_ranks_share(drop_last):
    """Resumed after k samples per rank, each rank draws the rest of its own uninterrupted
    share (the padding included)."""
    for rank in range(4):
        whole = _sampler(25, rank, 4, drop_last)
        whole.set_epoch(1)
        resumed = _sampler(25, rank, 4, drop_last)
        resumed.set_epoch(1, consumed=3 * 4)
        assert list(resumed) == list(whole)[3:]
        assert len(resumed) == len(list(resumed))


@pytest.mark.parametrize("before, after", [(4, 2), (4, 3), (2, 4), (3, 4)])
def test_rest_of_the_epoch_once_each_at_another_world_size(before, after):
    """2 samples taken by each of ``before`` ranks; ``after`` ranks take the rest once (a rest
    that ``after`` divides: otherwise DistributedSampler's padding repeats a few, by design)."""
    per_rank = 2
    size = per_rank * before + 6 * after
    taken = collections.Counter()
    for rank in range(before):
        first = _sampler(size, rank, before, drop_last=False)
        first.set_epoch(0)
        taken.update(list(first)[:per_rank])
    consumed = per_rank * before
    assert len(taken) == consumed
    for rank in range(after):
        rest = _sampler(size, rank, after, drop_last=False)
        rest.set_epoch(0, consumed=consumed)
        assert len(rest) == len(list(rest))
        taken.update(rest)
    assert sorted(taken) == list(range(size))
    assert set(taken.values()) == {1}
