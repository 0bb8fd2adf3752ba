"""A rank held back by its node: the quickstart model, sleeping in forward on one host.

Stands in for a node with a throttled CPU or a slow link: every rank waits for it at each
gradient all-reduce, and only the per-rank telemetry says which one it is.
"""

import socket
import time

from torch import nn

from examples.quickstart import make_model as make_quickstart_model


class SlowOnHost(nn.Module):
    """The quickstart MLP; on ``host`` every training forward first sleeps ``delay_s``."""

    def __init__(self, host: str, delay_s: float) -> None:
        super().__init__()
        self.inner = make_quickstart_model()
        self.slow = socket.gethostname() == host
        self.delay_s = delay_s

    def forward(self, inputs):
        if self.training and self.slow:
            time.sleep(self.delay_s)
        return self.inner(inputs)


def make_model(host: str = "", delay_s: float = 0.02) -> nn.Module:
    return SlowOnHost(host, delay_s)
