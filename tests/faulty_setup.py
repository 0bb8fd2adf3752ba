"""Factories that fail on purpose at set-up, for the bad-input tests: raise on one rank, give one
rank a dataset of another length, or ask for an argument the config does not give."""

import os
import time

from examples.quickstart import make_dataset as make_quickstart_dataset
from examples.quickstart import make_model as make_quickstart_model


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def make_model(fail_on_rank: int = -1, width: int = 256, hang_on_rank: int = -1):
    """The quickstart MLP, except on rank ``fail_on_rank``, where the user's code raises, and
    on rank ``hang_on_rank``, where it never returns (a download that stalls, say)."""
    if _rank() == fail_on_rank:
        check_width(width - 1)
    if _rank() == hang_on_rank:
        time.sleep(120)
    return make_quickstart_model(hidden=width)


def check_width(width: int) -> None:
    """The user's helper that raises: its frame must be the one the error names."""
    if width % 2:
        raise ValueError(f"width {width} must be even")


def make_dataset(fail_on_rank: int = -1, short_on_rank: int = -1, **kwargs):
    """The quickstart data; rank ``fail_on_rank`` raises, rank ``short_on_rank`` gets one sample
    less (what a non-deterministic or rank-dependent dataset does)."""
    if _rank() == fail_on_rank:
        raise FileNotFoundError(f"/data/shard-{_rank()}.bin is not on this node")
    if _rank() == short_on_rank:
        kwargs["train_size"] = kwargs.get("train_size", 256) - 1
    return make_quickstart_dataset(**kwargs)


def make_model_needing_width(width: int):
    """A factory whose required argument the config leaves out."""
    return make_quickstart_model(hidden=width)


def make_nothing():
    """A model factory that forgets to return its model."""
    make_quickstart_model()


NOT_A_FUNCTION = 42
