"""One optimizer step: micro-batches in, gradients synchronized once, the guard consulted.

Kept apart from the loop (`hpcddp.train.loop`) so that the arithmetic of a step, which the
parity test compares bit for bit with a hand-written loop, reads in one place. What differs
between a replicated and a sharded model (accumulating without reducing, the total gradient
norm) is the strategy's (`hpcddp.train.strategy`).
"""

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import torch

from hpcddp.config import Config
from hpcddp.train import batches, ddp
from hpcddp.train.guard import Guard, Seen
from hpcddp.train.strategy import Strategy, Wrapped
from hpcddp.train.task import Task
from hpcddp.train.telemetry import IntervalClock


@dataclasses.dataclass
class Stepper:
    """Everything a step touches."""

    cfg: Config
    device: torch.device
    wrapped: Wrapped  # the model, and what runs its training forward
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: "torch.amp.GradScaler | None"
    task: Task
    guard: Guard
    clock: IntervalClock
    strategy: Strategy

    @property
    def model(self) -> torch.nn.Module:
        return self.wrapped.model

    def step(
        self, loader: Iterator[Any], window: int, number: int, logging_next: bool = False
    ) -> tuple[torch.Tensor, Seen | None]:
        """Train on ``window`` micro-batches as step ``number``; (summed loss, what the guard
        found about this step, or on CUDA the one before).

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
            with self.strategy.micro_batch(self.wrapped, last=i == window - 1):
                with clock.phase("forward_s", measured):
                    with ddp.autocast(self.cfg.train.precision, self.device):
                        loss = self.task.loss(self.wrapped.forward, self.model, batch) / window
                    loss = self.guard.seeded(loss)
                with clock.phase("backward_s", measured):
                    (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
        with clock.phase("optimizer_s", measured):
            seen = (
                self._scaled_step(self.scaler, number)
                if self.scaler
                else self._optimizer_step(number)
            )
        clock.step(samples, tokens, measured)
        return total, seen

    def _optimizer_step(self, number: int) -> Seen | None:
        """Check, clip, step; no step when the guard finds the gradients not finite."""
        clip = self.cfg.optim.grad_clip_norm
        params = [p for p in self.model.parameters() if p.grad is not None]
        # sharded gradients: the guard needs the whole norm (a probe sees one shard)
        wanted = clip or (self.strategy.shards_gradients and self.guard.active)
        norm = self.strategy.grad_norm(_grads(params)) if wanted else None
        skip, seen = self.guard.look(params, norm, number)
        if not skip:
            if clip:  # the norm may be the guard's alone (fsdp): 0 is no clipping, not to 0
                assert norm is not None
                torch.nn.utils.clip_grads_with_norm_(params, clip, norm)
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return seen

    def _scaled_step(self, scaler: "torch.amp.GradScaler", number: int) -> Seen | None:
        """fp16: unscale, clip, let GradScaler step (it skips a step whose gradients overflowed,
        or that a non-finite loss poisoned) and lower or raise its scale."""
        clip = self.cfg.optim.grad_clip_norm
        params = [p for p in self.model.parameters() if p.grad is not None]
        scaler.unscale_(self.optimizer)  # always: its found_inf is what the guard reads
        seen = self.guard.look_scaled(ddp.found_inf(scaler, self.optimizer), number)
        if clip:
            norm = self.strategy.grad_norm(_grads(params))
            torch.nn.utils.clip_grads_with_norm_(params, clip, norm)
        scaler.step(self.optimizer)
        scaler.update()
        if not (seen is not None and seen.step == number and seen.nonfinite):
            self.scheduler.step()  # an overflow step is a step; a non-finite one is not
        self.optimizer.zero_grad(set_to_none=True)
        return seen


def _grads(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [p.grad for p in params if p.grad is not None]
