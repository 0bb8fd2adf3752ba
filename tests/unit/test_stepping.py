"""The optimizer step's arithmetic under each strategy, in one process: with the gradients in
place, a step is the hand-written one (clip when ``optim.grad_clip_norm`` asks, then AdamW).

Under fsdp the step computes the total gradient norm for the guard even when nothing is
clipped; that norm must not be taken as a reason to clip (``grad_clip_norm=0`` once scaled
every gradient to zero there, and an fsdp run without clipping never moved).
"""

import copy

import pytest
import torch
from torch import nn

from hpcddp.config import TrainConfig
from hpcddp.config.loading import load_config
from hpcddp.train.guard import Guard
from hpcddp.train.stepping import Stepper
from hpcddp.train.strategy import Wrapped
from hpcddp.train.strategy_ddp import Ddp
from hpcddp.train.strategy_fsdp import Fsdp
from tests.fixtures.helpers import QUICKSTART


def _with_gradients(model: nn.Module) -> nn.Module:
    generator = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator)
    return model


def _stepper(model: nn.Module, strategy, clip: float) -> Stepper:
    cfg = load_config(QUICKSTART, [f"optim.grad_clip_norm={clip}"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return Stepper(
        cfg=cfg, device=torch.device("cpu"), wrapped=Wrapped(model, model), optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), scaler=None,
        task=None, guard=Guard(TrainConfig(), "cpu", scaled=False), clock=None,
        strategy=strategy,
    )  # fmt: skip


@pytest.mark.parametrize("clip", [0.0, 0.5])
@pytest.mark.parametrize("strategy", [Ddp(), Fsdp()], ids=["ddp", "fsdp"])
def test_a_step_is_the_hand_written_one(strategy, clip):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    by_hand = _with_gradients(copy.deepcopy(model))
    stepper = _stepper(_with_gradients(model), strategy, clip)

    seen = stepper._optimizer_step(number=1)

    if clip:
        torch.nn.utils.clip_grad_norm_(by_hand.parameters(), clip)
    torch.optim.AdamW(by_hand.parameters(), lr=0.1).step()
    assert seen is not None and not seen.nonfinite
    for got, expected in zip(model.parameters(), by_hand.parameters(), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-7)
    assert all(p.grad is None for p in model.parameters())  # dropped for the next step
