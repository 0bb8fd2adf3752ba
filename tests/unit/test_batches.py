"""Any batch, any output: moving to the device, feeding the model, finding the loss."""

import collections
import dataclasses
import math

import pytest
import torch
from torch import nn

from hpcddp.config import TaskConfig
from hpcddp.errors import ConfigError
from hpcddp.train import batches
from hpcddp.train.task import Task

Pair = collections.namedtuple("Pair", "x y")


@dataclasses.dataclass
class Sample:
    pixels: torch.Tensor
    meta: dict


def test_every_tensor_of_a_nested_batch_moves_and_containers_keep_their_type(monkeypatch):
    moved = []
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *a, **kw: moved.append(kw) or t + 100)
    batch = {
        "a": torch.zeros(2),
        "nested": [torch.ones(1), (torch.ones(1), "text")],
        "pair": Pair(torch.zeros(1), 3),
        "sample": Sample(torch.zeros(1), {"deep": torch.zeros(1)}),
    }
    out = batches.to_device(batch, torch.device("cpu"))
    assert out["a"].tolist() == [100, 100] and out["nested"][1][1] == "text"
    assert isinstance(out["pair"], Pair) and out["pair"].y == 3 and out["pair"].x.item() == 100
    assert isinstance(out["sample"], Sample) and out["sample"].meta["deep"].item() == 100
    assert len(moved) == 6 and all(kw == {"non_blocking": False} for kw in moved)


def test_hf_batch_encoding_and_model_output_keep_their_class():
    transformers = pytest.importorskip("transformers")
    encoding = transformers.BatchEncoding({"input_ids": torch.zeros(1, 2, dtype=torch.long)})
    assert type(batches.to_device(encoding, torch.device("cpu"))) is transformers.BatchEncoding
    output = transformers.modeling_outputs.CausalLMOutput(logits=torch.zeros(1, 2, 3))
    moved = batches.to_device(output, torch.device("cpu"))
    assert type(moved) is type(output) and moved.logits.shape == (1, 2, 3)


class Plain(nn.Module):
    def forward(self, x):
        return x


class TakesAll(nn.Module):
    def forward(self, input_ids, **kwargs):
        return input_ids


@pytest.mark.parametrize(
    "model, batch, args, kwargs, targets",
    [
        (Plain(), (1, 2), (1,), {}, 2),
        (Plain(), [1, 2], (1,), {}, 2),
        (Plain(), (1,), (1,), {}, None),
        (Plain(), {"x": 1, "labels": 2}, (), {"x": 1}, 2),  # labels kept back as targets
        (TakesAll(), {"input_ids": 1, "labels": 2}, (), {"input_ids": 1, "labels": 2}, 2),
    ],
    ids=["pair", "list-pair", "one-tuple", "dict-plain-model", "dict-hf-style"],
)
def test_feed(model, batch, args, kwargs, targets):
    assert batches.feed(batch, model) == (args, kwargs, targets)


def test_feed_tensor_and_refusal():
    t = torch.zeros(2)
    assert batches.feed(t, Plain()).args[0] is t
    with pytest.raises(ConfigError, match=r"Sample cannot be fed.*HINT: define training_step"):
        batches.feed(Sample(t, {}), Plain())
    with pytest.raises(ConfigError, match="tuple cannot be fed"):
        batches.feed((t, t, t), Plain())


LOGITS = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
LOSS = torch.tensor(0.5)


def model_output(**fields):
    transformers = pytest.importorskip("transformers")
    return transformers.modeling_outputs.SequenceClassifierOutput(**fields)


@pytest.mark.parametrize(
    "make, loss",
    [
        (lambda: LOGITS, None),
        (lambda: (LOGITS, torch.zeros(1)), None),
        (lambda: {"logits": LOGITS}, None),
        (lambda: {"hidden": torch.zeros(3), "logits": LOGITS}, None),
        (lambda: {"loss": LOSS, "logits": LOGITS}, LOSS),
        (lambda: model_output(logits=LOGITS), None),
        (lambda: model_output(loss=LOSS, logits=LOGITS), LOSS),
    ],
    ids=["tensor", "tuple", "dict", "dict-logits-not-first", "dict-loss", "output", "output-loss"],
)
def test_outputs_give_their_logits_and_loss(make, loss):
    output = make()
    assert batches.logits_of(output) is LOGITS
    assert batches.output_loss(output) is loss


def test_output_without_a_tensor_is_explained():
    with pytest.raises(ConfigError, match="holds no tensor to score"):
        batches.logits_of({"loss": LOSS, "note": "x"})


# -- where the loss comes from -------------------------------------------------------------------


class WithHooks(nn.Module):
    """Output carries a loss; the model also defines the hooks given to it."""

    def __init__(self, hooks=()):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        for name in hooks:
            setattr(self, name, getattr(self, f"_{name}"))

    def forward(self, x, labels=None):
        return {"loss": self.w * 3, "logits": x * self.w}

    def _training_step(self, model, batch):
        return model(batch["x"])["logits"].sum() * 0 + 1.0

    def _compute_loss(self, outputs, targets):
        return outputs["logits"].sum() * 0 + 2.0


def config_step(model, batch):
    return torch.tensor(4.0)


@pytest.mark.parametrize(
    "hooks, cfg, expected",
    [
        ((), TaskConfig(), 3.0),  # the output's own loss
        ((), TaskConfig(loss="mse"), 3.0),  # an output loss beats the configured loss
        (("compute_loss",), TaskConfig(), 2.0),
        (("compute_loss", "training_step"), TaskConfig(), 1.0),
        (("training_step",), TaskConfig(training_step=f"{__name__}:config_step"), 4.0),
    ],
    ids=["output-loss", "output-over-config", "compute-loss", "training-step", "config-hook"],
)
def test_loss_precedence(hooks, cfg, expected):
    model = WithHooks(hooks)
    task = Task.resolve(cfg, model)
    batch = {"x": torch.ones(2), "labels": torch.zeros(2)}
    assert task.loss(model, model, batch).item() == expected


def test_configured_loss_when_the_output_has_none():
    task = Task.resolve(TaskConfig(kind="regression"), Plain())
    loss = task.loss(Plain(), Plain(), (torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0])))
    assert loss.item() == pytest.approx((1 + 4) / 2)  # mse; (B, 1) against (B,) squeezed
    sequence = Task.resolve(TaskConfig(), Plain())
    logits = torch.zeros(2, 3, 5)
    targets = torch.tensor([[1, 2, -100], [0, -100, -100]])  # padding left out
    assert sequence.loss(Plain(), Plain(), (logits, targets)).item() == pytest.approx(math.log(5))


def test_no_targets_and_no_output_loss_is_explained():
    task = Task.resolve(TaskConfig(), Plain())
    with pytest.raises(ConfigError, match="no loss for an output of type Tensor"):
        task.loss(Plain(), Plain(), torch.zeros(2))


def test_a_hook_returning_no_scalar_is_explained():
    task = Task.resolve(TaskConfig(), Plain())
    task.training_step = lambda model, batch: {"loss": 1}
    with pytest.raises(ConfigError, match="training_step returned dict"):
        task.loss(Plain(), Plain(), torch.zeros(2))


def test_unknown_loss_and_hook_paths_are_refused_in_the_config():
    with pytest.raises(ConfigError, match="task.loss='huber'"):
        TaskConfig(loss="huber")
    with pytest.raises(ConfigError, match="task.kind='segmentation'"):
        TaskConfig(kind="segmentation")
    with pytest.raises(ConfigError, match="task.eval_step='steps'"):
        TaskConfig(eval_step="steps")
