"""The quickstart model, with checkpoint writes slowed down so a test can act while one is in
flight (a kill -9, a stop signal). Named as the model factory, it is imported in every rank."""

import functools
import time

from examples.quickstart import make_model as make_quickstart_model
from hpcddp.storage import atomic

_write_all = atomic.write_all


def _slowly(delay_s: float, fd: int, view: memoryview) -> None:
    time.sleep(delay_s)
    _write_all(fd, view)


def make_model(write_delay_s: float = 1.0, dropout: float = 0.0):
    """The quickstart MLP; every write() of a checkpoint now waits ``write_delay_s`` first."""
    atomic.write_all = functools.partial(_slowly, write_delay_s)
    return make_quickstart_model(dropout=dropout)
