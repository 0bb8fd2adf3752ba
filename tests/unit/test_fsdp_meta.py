"""fsdp's meta-device build (`hpcddp.train.fsdp_meta`, ``dist.fsdp_meta_init``), on one process
in a world of 1 (gloo): which models may be built on meta, the one-line refusal naming what
could not be initialised, initialisation through HF's ``init_weights``, the same seed giving
the same weights."""

import logging

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hpcddp.config import load_config
from hpcddp.errors import ConfigError
from hpcddp.launch.distenv import DistEnv
from hpcddp.train import fsdp_meta, rng
from hpcddp.train.strategy_fsdp import Fsdp

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 29500, "local", "")
    dist.destroy_process_group()


def _config(*overrides: str):
    return load_config(None, ["dist.strategy=fsdp", *overrides])


class Rotary(nn.Module):
    """A table computed in ``__init__`` (no parameters, no reset_parameters): on meta it is lost."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(8.0), persistent=False)


class WithTable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.rotary = Rotary()

    def forward(self, x):
        for layer in self.layers:
            x = layer(x) + self.rotary.table
        return x


class Plain(nn.Module):
    """Every tensor in a module with reset_parameters(), and no init_weights()."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class ForgetsTable(WithTable):
    """init_weights() that sets the layers but forgets the table."""

    def init_weights(self) -> None:
        for layer in self.layers:
            layer.reset_parameters()


def _built(factory, cfg, env):
    """What training would get: built by fsdp's rule, wrapped, materialised."""
    spread = Fsdp()
    model = spread.build(factory, cfg, torch.device("cpu"))
    return spread.wrap(model, cfg, env, torch.device("cpu")).model


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.full_tensor().clone() for name, p in model.named_parameters()}


def test_a_buffer_no_initialisation_recreates_is_refused_in_one_line_naming_it():
    with pytest.raises(ConfigError) as refused:
        Fsdp().build(WithTable, _config("dist.fsdp_meta_init=true"), torch.device("cpu"))
    message = str(refused.value)
    assert "\n" not in message
    assert "rotary.table" in message and "layers" not in message
    assert "init_weights()" in message and "dist.fsdp_meta_init=false" in message


def test_a_parameter_of_a_module_without_reset_parameters_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.MultiheadAttention(4, 1))
    with torch.device("meta"):
        missing = fsdp_meta.uncovered(model)
    assert missing == ["1.in_proj_weight", "1.in_proj_bias"]


def test_auto_builds_a_model_without_init_weights_whole_and_says_why(caplog):
    with caplog.at_level(logging.WARNING):
        model = Fsdp().build(WithTable, _config(), torch.device("cpu"))
    assert not fsdp_meta.is_meta(model)
    assert torch.equal(model.rotary.table, torch.arange(8.0))
    assert "rotary.table" in caplog.text and "dist.fsdp_meta_init=true" in caplog.text
    # reset_parameters() everywhere is not enough: the factory may initialise otherwise
    assert not fsdp_meta.is_meta(Fsdp().build(Plain, _config(), CPU))
    assert fsdp_meta.is_meta(Fsdp().build(Plain, _config("dist.fsdp_meta_init=true"), "cpu"))


def test_an_init_weights_that_misses_a_tensor_is_refused_after_it_ran(world_of_one):
    cfg = _config()  # auto: init_weights() is trusted, then checked
    with pytest.raises(ConfigError, match=r"cannot initialise rotary\.table \(.*HINT"):
        _built(ForgetsTable, cfg, world_of_one)


def test_same_seed_same_weights_on_meta_and_every_tensor_initialised(world_of_one):
    cfg = _config("dist.fsdp_meta_init=true", "run.seed=3")
    first, second = [], []
    for out in (first, second):
        rng.seed_everything(3)
        model = _built(Plain, cfg, world_of_one)
        assert not fsdp_meta.is_meta(model)
        out.append(_weights(model))
    for name, value in first[0].items():
        assert torch.equal(value, second[0][name]), name
        assert torch.isfinite(value).all(), name
    assert torch.equal(first[0]["norm.weight"], torch.ones(16))  # LayerNorm's reset_parameters
    rng.seed_everything(4)
    other = _weights(_built(Plain, cfg, world_of_one))
    assert not torch.equal(other["layers.0.weight"], first[0]["layers.0.weight"])


def test_hf_gpt2_from_config_builds_on_meta_and_initialises_through_init_weights(world_of_one):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    rng.seed_everything(0)
    spread, cfg = Fsdp(), _config()  # auto
    model = spread.build(lambda: transformers.GPT2LMHeadModel(config), cfg, torch.device("cpu"))
    assert fsdp_meta.is_meta(model)  # built without storage
    model = spread.wrap(model, cfg, world_of_one, torch.device("cpu")).model
    weights = _weights(model)
    assert all(torch.isfinite(value).all() for value in weights.values())
    # GPT-2's init_weights: normal(0, 0.02) embeddings (reset_parameters would give N(0, 1)),
    # residual projections scaled by 1/sqrt(2 * layers), LayerNorms at one
    assert 0.015 < weights["transformer.wte.weight"].std() < 0.025
    assert 0.007 < weights["transformer.h.0.mlp.c_proj.weight"].std() < 0.013
    assert torch.equal(weights["transformer.h.1.ln_2.weight"], torch.ones(32))
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    logits = model(torch.arange(8).unsqueeze(0)).logits
    assert logits.shape == (1, 8, 64) and torch.isfinite(logits).all()


def test_the_switch_takes_yaml_booleans_and_refuses_anything_else(tmp_path):
    written = tmp_path / "c.yaml"
    written.write_text("dist:\n  fsdp_meta_init: false\n")
    assert load_config(str(written), []).dist.fsdp_meta_init == "false"
    with pytest.raises(ConfigError, match=r"fsdp_meta_init='sometimes' is not one of"):
        _config("dist.fsdp_meta_init=sometimes")


TRAINED = nn.Linear(8, 8).state_dict()  # as torch.load gives them: real tensors


def _loads_weights() -> nn.Module:
    """A fine-tune's factory: the weights it loads would be lost to a meta build's init."""
    model = ForgetsTable()
    model.layers[0].load_state_dict(TRAINED)
    return model


def _refuses_meta() -> nn.Module:
    """As Hugging Face's from_pretrained does under a meta device."""
    if torch.empty(0).is_meta:
        raise RuntimeError("from_pretrained wants to load existing weights\nmore")
    return ForgetsTable()


@pytest.mark.parametrize(
    ("factory", "said"),
    [(_loads_weights, "puts values into it"), (_refuses_meta, "failed on the meta device")],
)
def test_auto_builds_whole_a_model_whose_factory_loads_weights_or_fails_on_meta(
    caplog, factory, said
):
    with caplog.at_level(logging.WARNING):
        model = Fsdp().build(factory, _config(), CPU)  # ForgetsTable has init_weights()
    assert not fsdp_meta.is_meta(model)
    assert said in caplog.text and len(caplog.records) == 1
    assert "\n" not in caplog.records[0].getMessage()


def test_true_refuses_a_factory_that_loads_weights():
    with pytest.raises(ConfigError, match=r"puts values into it .*HINT"):
        Fsdp().build(_loads_weights, _config("dist.fsdp_meta_init=true"), CPU)
