"""How the model is spread over the ranks (``dist.strategy``): one small interface, two answers.

The loop, the step and the checkpoints ask a `Strategy` the few questions whose answers differ
between a whole replica per rank (`hpcddp.train.strategy_ddp`) and a model sharded across the
ranks (`hpcddp.train.strategy_fsdp`): where the model is built, how it is wrapped, how a
micro-batch accumulates without reducing (or resharding) until the last, what the total
gradient norm is, and who saves and loads the training state. Everything else (precision, the
guard, telemetry, stops) is the same code under both.
"""

import abc
import contextlib
import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from hpcddp.config import Config
from hpcddp.launch.distenv import DistEnv


@dataclasses.dataclass
class Wrapped:
    """The model as a strategy made it."""

    model: torch.nn.Module  # what is optimized, saved and evaluated
    forward: torch.nn.Module  # what runs a training forward (DDP's wrapper, or ``model``)


class Strategy(abc.ABC):
    """What ddp and fsdp each decide; `of` picks one from the config."""

    name: ClassVar[str]
    shards_gradients: ClassVar[bool]  # a rank holds a shard of each gradient, not all of it

    @abc.abstractmethod
    def build(
        self, make: Callable[[], torch.nn.Module], cfg: Config, device: torch.device
    ) -> torch.nn.Module:
        """The model ``make`` (the user's factory) builds, where this strategy wants it before
        `wrap`: on the rank's device (ddp), or with no storage yet (fsdp on the meta device)."""

    @abc.abstractmethod
    def wrap(
        self, model: torch.nn.Module, cfg: Config, env: DistEnv, device: torch.device
    ) -> Wrapped:
        """The user's model, ready to train on this rank."""

    @abc.abstractmethod
    def micro_batch(self, wrapped: Wrapped, last: bool) -> contextlib.AbstractContextManager[None]:
        """Around one micro-batch's forward and backward: gradients are reduced (and
        parameters resharded) on the last micro-batch of a step only."""

    @abc.abstractmethod
    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The total 2-norm of the model's gradients, the same plain tensor on every rank."""

    @abc.abstractmethod
    def checkpointer(self, run_dir: pathlib.Path, cfg: Config, env: DistEnv, trained: Any) -> Any:
        """Who saves and resumes the training state (`hpcddp.train.checkpointing.Checkpointer`
        or `hpcddp.train.sharded_checkpointing.ShardedCheckpointer`: the same four calls)."""


def of(cfg: Config) -> Strategy:
    """The strategy ``dist.strategy`` names."""
    if cfg.dist.strategy == "fsdp":
        from hpcddp.train.strategy_fsdp import Fsdp

        return Fsdp()
    from hpcddp.train.strategy_ddp import Ddp

    return Ddp()
