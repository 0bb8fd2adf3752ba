"""One optimizer step: micro-batches in, gradients synchronized once, the guard consulted.

Kept apart from the loop (`hpcddp.train.loop`) so that the arithmetic of a step, which the
parity test compares bit for bit with a hand-written loop, reads in one place.
"""

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from hpcddp.config import Config
from hpcddp.train import batches, ddp
from hpcddp.train.guard import Guard
from hpcddp.train.task import Task
from hpcddp.train.telemetry import IntervalClock


@dataclasses.dataclass
class Stepper:
    """Everything a step touches."""

    cfg: Config
    device: torch.device
    ddp: DDP
    model: torch.nn.Module  # unwrapped
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: "torch.amp.GradScaler | None"
    task: Task
    guard: Guard
    clock: IntervalClock

    def step(
        self, loader: Iterator[Any], window: int, logging_next: bool = False
    ) -> tuple[torch.Tensor, bool]:
        """Train on ``window`` micro-batches; (summed loss, whether the step was non-finite).

        Gradients sync on the last micro-batch only. A non-finite step is not applied: the
        optimizer does not move and its gradients are dropped. The clock counts the time
        blocked on the loader, the samples and tokens seen, and (when ``measures_split``) the
        forward / backward / optimizer split.
        """
        clock = self.clock
        measured = clock.measures_split(logging_next)
        total = torch.zeros((), device=self.device)
        samples = tokens = 0
        for i in range(window):
            waited = time.perf_counter()
            raw = next(loader)
            clock.add("data_wait_s", time.perf_counter() - waited)
            samples, tokens = samples + batches.size_of(raw), tokens + batches.tokens_of(raw)
            batch = batches.to_device(raw, self.device)
            sync = contextlib.nullcontext() if i == window - 1 else self.ddp.no_sync()
            with sync:
                with clock.phase("forward_s", measured):
                    with ddp.autocast(self.cfg.train.precision, self.device):
                        loss = self.task.loss(self.ddp, self.model, batch) / window
                    loss = self.guard.seeded(loss)
                with clock.phase("backward_s", measured):
                    (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
        with clock.phase("optimizer_s", measured):
            nonfinite = self._optimizer_step()
        clock.step(samples, tokens, measured)
        return total, nonfinite

    def _optimizer_step(self) -> bool:
        """Unscale, check, clip, step; True (and no step) when the gradients are not finite."""
        clip = self.cfg.optim.grad_clip_norm
        params = [p for p in self.model.parameters() if p.grad is not None]
        grads = [p.grad for p in params if p.grad is not None]
        if self.scaler and (clip or self.guard.active):
            self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.get_total_norm(grads) if clip else None
        if self.guard.bad_now(params, norm):
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler:
                self.scaler.update()  # unscale_ was called: the scaler expects an update
            return True
        if norm is not None:
            torch.nn.utils.clip_grads_with_norm_(params, clip, norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return False
