"""``dist.strategy: ddp``: a whole replica per rank, gradients all-reduced in buckets."""

import contextlib
import pathlib
from collections.abc import Callable
from typing import Any

import torch

from hpcddp.config import Config
from hpcddp.launch.distenv import DistEnv
from hpcddp.train import ddp
from hpcddp.train.checkpointing import Checkpointer
from hpcddp.train.strategy import Strategy, Wrapped


class Ddp(Strategy):
    """DistributedDataParallel (`hpcddp.train.ddp`); rank 0 writes the whole state."""

    name = "ddp"
    shards_gradients = False

    def build(
        self, make: Callable[[], torch.nn.Module], cfg: Config, device: torch.device
    ) -> torch.nn.Module:
        return make().to(device)

    def wrap(
        self, model: torch.nn.Module, cfg: Config, env: DistEnv, device: torch.device
    ) -> Wrapped:
        model, wrapper = ddp.wrap(model, cfg, env, device)
        return Wrapped(model, wrapper)

    def micro_batch(self, wrapped: Wrapped, last: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if last else wrapped.forward.no_sync()  # type: ignore[operator]

    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        return torch.nn.utils.get_total_norm(grads)

    def checkpointer(
        self, run_dir: pathlib.Path, cfg: Config, env: DistEnv, trained: Any
    ) -> Checkpointer:
        return Checkpointer(run_dir, cfg, env, trained)
