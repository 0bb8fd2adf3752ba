"""A quickstart model that fails on purpose, for the failure tests: raise, hang, or produce NaN
on one rank."""

import os
import time

from torch import nn

from examples.quickstart import make_model as make_quickstart_model


class Faulty(nn.Module):
    """Wraps the quickstart MLP; at forward call ``at_call`` on rank ``rank`` it misbehaves."""

    def __init__(self, rank: int, at_call: int, mode: str) -> None:
        super().__init__()
        self.inner = make_quickstart_model()
        self.rank, self.at_call, self.mode, self.calls = rank, at_call, mode, 0

    def forward(self, inputs):
        if self.training:
            self.calls += 1
        if self.calls == self.at_call and int(os.environ.get("RANK", "-1")) == self.rank:
            if self.mode == "raise":
                raise RuntimeError(f"injected failure on rank {self.rank}")
            if self.mode == "nan":
                return self.inner(inputs) * float("nan")
            time.sleep(3600)  # "hang": stuck in user code, never reaching the collective
        return self.inner(inputs)


def make_model(rank: int = 1, at_call: int = 5, mode: str = "raise") -> nn.Module:
    """The factory the failure tests name in their config overrides."""
    return Faulty(rank, at_call, mode)
