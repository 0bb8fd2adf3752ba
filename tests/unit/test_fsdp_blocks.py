"""Which modules fsdp shards one by one (named classes, else the repeated blocks it finds), and
what each is given: activation checkpointing, CPU offload."""

import types

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy

from examples.chargpt import CharGPT
from hpcddp.config.loading import load_config
from hpcddp.errors import ConfigError
from hpcddp.train import strategy_fsdp
from hpcddp.train.strategy_fsdp import blocks, offload, prepared_blocks
from tests.fixtures.sharded_transformer import Block, TinyTransformer


def test_the_children_of_the_largest_module_list():
    model = TinyTransformer(layers=3)
    assert blocks(model, []) == list(model.blocks)


def test_a_sequential_of_one_repeated_class_counts_as_blocks():
    model = CharGPT(vocab_size=16, block_size=8, d_model=16, n_layers=3, n_heads=2, dropout=0.0)
    found = blocks(model, [])
    assert len(found) == 3 and {type(b).__name__ for b in found} == {"Block"}


def test_named_classes_outermost_only():
    model = TinyTransformer(layers=2)
    assert blocks(model, ["Block", "MultiheadAttention"]) == list(model.blocks)
    assert all(isinstance(b, Block) for b in blocks(model, ["Block"]))


def test_a_named_class_the_model_lacks_is_refused_with_what_it_has():
    with pytest.raises(ConfigError, match=r"GPT2Block.*TinyTransformer.*HINT"):
        blocks(TinyTransformer(), ["GPT2Block"])


def test_no_blocks_in_a_flat_model():
    assert blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), []) == []


def _config(*overrides: str):
    return load_config("tests/fixtures/sharded_transformer.yaml", overrides)


def _forwards_per_block(checkpointing: bool) -> list[int]:
    """How often each block's first linear layer runs in one forward and backward."""
    model = TinyTransformer(layers=2)
    cfg = _config(f"dist.fsdp_activation_checkpointing={str(checkpointing).lower()}")
    counts = []
    for block in prepared_blocks(model, cfg):
        counts.append(0)
        index = len(counts) - 1
        block.mlp[0].register_forward_hook(lambda *_, i=index: counts.__setitem__(i, counts[i] + 1))
    model(torch.randint(0, 32, (2, 8))).sum().backward()
    return counts


def test_activation_checkpointing_recomputes_each_block_in_the_backward():
    assert _forwards_per_block(checkpointing=False) == [1, 1]
    assert _forwards_per_block(checkpointing=True) == [2, 2]


def test_activation_checkpointing_keeps_the_parameter_names():
    """Checkpoints stay interchangeable with runs without it."""
    model = TinyTransformer(layers=2)
    names = [name for name, _ in model.named_parameters()]
    prepared_blocks(model, _config("dist.fsdp_activation_checkpointing=true"))
    assert [name for name, _ in model.named_parameters()] == names


def test_cpu_offload_is_refused_on_a_cpu_rank_with_a_hint():
    with pytest.raises(ConfigError, match=r"fsdp_cpu_offload=true needs GPUs.*HINT"):
        offload(_config("dist.fsdp_cpu_offload=true"), torch.device("cpu"))


def test_cpu_offload_policy_reaches_every_fully_shard_on_a_gpu(monkeypatch):
    """The device check faked: a CUDA rank, fully_shard and the mesh recorded, not run."""
    calls = []
    monkeypatch.setattr(strategy_fsdp, "init_device_mesh", lambda *a, **k: "mesh")
    monkeypatch.setattr(strategy_fsdp, "fully_shard", lambda m, **k: calls.append((m, k)))
    model, env = TinyTransformer(layers=2), types.SimpleNamespace(world_size=2)
    cfg = _config("dist.fsdp_cpu_offload=true")
    strategy_fsdp.Fsdp().wrap(model, cfg, env, torch.device("cuda", 0))  # type: ignore[arg-type]
    assert [m for m, _ in calls] == [*model.blocks, model]
    assert all(isinstance(k["offload_policy"], CPUOffloadPolicy) for _, k in calls)
    assert not isinstance(offload(_config(), torch.device("cuda", 0)), CPUOffloadPolicy)
