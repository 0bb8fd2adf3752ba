"""Which modules fsdp shards one by one: named classes, else the repeated blocks it finds."""

import pytest
from torch import nn

from examples.chargpt import CharGPT
from hpcddp.errors import ConfigError
from hpcddp.train.strategy_fsdp import blocks
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
