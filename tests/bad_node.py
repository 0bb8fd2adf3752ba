"""A node that kills its rank: the quickstart model, dying on the host a file names.

The test writes the host once the job has started (it cannot know the node before), and the
rank on that host kills itself at its next training step, as a rank on a broken node dies.
"""

import os
import pathlib
import signal
import socket

from torch import nn

from examples.quickstart import make_model as make_quickstart_model


class OnBadNode(nn.Module):
    """Wraps the quickstart MLP; from training call ``at_call`` on, dies on the named host."""

    def __init__(self, host_file: str, at_call: int) -> None:
        super().__init__()
        self.inner = make_quickstart_model()
        self.host_file, self.at_call, self.calls = pathlib.Path(host_file), at_call, 0

    def forward(self, inputs):
        if self.training:
            self.calls += 1
            if self.calls >= self.at_call and self._here_is_bad():
                os.kill(os.getpid(), signal.SIGKILL)  # no exception, no last words
        return self.inner(inputs)

    def _here_is_bad(self) -> bool:
        try:
            return self.host_file.read_text().strip() == socket.gethostname()
        except OSError:
            return False


def make_model(host_file: str, at_call: int = 10) -> nn.Module:
    """The factory the tests name: ``model.kwargs={host_file: ..., at_call: N}``."""
    return OnBadNode(host_file, at_call)
