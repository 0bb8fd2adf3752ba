"""Object collectives and agreements go over the one gloo side group, never the default group
(under NCCL an object collective needs CUDA tensors and a lost peer aborts the process)."""

import types

import pytest
import torch.distributed as dist

from hpcddp.comm import agreement, collectives, sidegroup


@pytest.fixture
def two_ranks_seen(monkeypatch):
    """A real one-rank gloo world that calls itself two ranks wide; object collectives record
    the group they are given instead of running."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    groups = []

    def record(*args, group=None, **kwargs):
        groups.append(group)

    for name in ("broadcast_object_list", "all_gather_object", "gather_object"):
        monkeypatch.setattr(dist, name, record)
    yield groups
    dist.destroy_process_group()


def test_object_collectives_and_agreements_use_the_gloo_side_group(two_ranks_seen):
    collectives.broadcast_object("x")
    collectives.all_gather_object("x")
    collectives.gather_object("x")
    collectives.on_rank_zero(lambda: 1, rank=0, what="count")
    env = types.SimpleNamespace(rank=0, world_size=2, hostname="h", environ={})
    with pytest.raises(TypeError):  # the recorder gathers nothing; the group is what counts
        agreement.agree(None, env=env, timeout_s=5.0)
    side = sidegroup.side_group()
    assert side is not None and side is not dist.group.WORLD
    assert two_ranks_seen == [side] * 5
    assert dist.get_backend(side) == "gloo"


def test_work_given_to_rank_zero_runs_there_only():
    """Rank 0 alone writes (checkpoints, records): another rank never runs the work itself."""
    ran = []
    assert (
        collectives.on_rank_zero(lambda: ran.append(0) or "saved", rank=0, what="save") == "saved"
    )
    collectives.on_rank_zero(lambda: ran.append(1), rank=1, what="save")
    assert ran == [0]
