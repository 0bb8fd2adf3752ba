"""The NaN/inf guard: every rank sees a non-finite step at the same step, with no extra collective.

A loss that is not finite on rank r is known only to rank r. Rather than vote on it every
step (a collective per step), rank r seeds its backward with NaN (``loss * seed``, where the
seed is 1.0 for a finite loss, exactly, so the arithmetic is unchanged): every gradient it
computes is then NaN, and DDP's own gradient all-reduce carries that to every rank. After the
backward each rank checks one gradient, that of the parameter nearest the loss (the first whose
gradient became ready in the warm-up backward: its every element depends on the loss), which
holds the same all-reduced values everywhere, so all ranks decide alike at step k.

``train.nonfinite_grad_norm`` (or gradient clipping, which computes the norm anyway) checks the
whole gradient norm instead, which also catches a NaN/inf gradient under a finite loss.

Policies: ``stop`` (the run ends at step k without saving it; the latest checkpoint is the
last good one), ``skip`` (the optimizer does not step, the step is counted, more than
``nonfinite_max_skips`` of them end the run), ``off``. On CUDA with ``stop`` the check is read
one step late (a copy to pinned memory, no sync per step); ``skip`` must know before the
optimizer steps and reads it at once.
"""

import contextlib
from collections.abc import Iterator

import torch

from hpcddp.config import TrainConfig


class Guard:
    """One rank's side of the guard (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, device: torch.device, scaled: bool) -> None:
        self.policy, self.max_skips = cfg.nonfinite, cfg.nonfinite_max_skips
        self.full_norm = cfg.nonfinite_grad_norm
        self.scaled = scaled  # fp16: overflow (inf) is GradScaler's business; we look for NaN
        self.lagged = device.type == "cuda" and self.policy == "stop"
        self.probe: torch.nn.Parameter | None = None
        self._pending: tuple[torch.Tensor, torch.cuda.Event] | None = None

    @property
    def active(self) -> bool:
        """False with ``train.nonfinite=off``."""
        return self.policy != "off"

    def seeded(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times 1.0 (finite) or NaN (not), so every rank's gradients show it."""
        if not self.active:
            return loss
        finite = torch.isfinite(loss.detach())
        return loss * torch.where(finite, 1.0, float("nan")).to(loss.dtype)

    @contextlib.contextmanager
    def find_probe(self, model: torch.nn.Module) -> Iterator[None]:
        """Within: the first parameter whose gradient becomes ready becomes the probe."""
        seen: list[torch.nn.Parameter] = []
        handles = [
            p.register_post_accumulate_grad_hook(seen.append)
            for p in model.parameters()
            if p.requires_grad
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
        self.probe = seen[0] if seen else None

    def bad_now(self, params: list[torch.nn.Parameter], norm: torch.Tensor | None) -> bool:
        """After the all-reduce, before the optimizer: is this step's gradient non-finite?

        ``norm`` is the total gradient norm when it was computed anyway (clipping). Under
        ``lagged``, the answer is the previous step's.
        """
        if not self.active:
            return False
        flag = self._flag(params, norm)
        if not self.lagged:
            return bool(flag)
        previous, self._pending = self._pending, _to_host(flag)
        return _read(previous)

    def settle(self) -> bool:
        """The pending lagged answer, read now (before a checkpoint, at the end)."""
        previous, self._pending = self._pending, None
        return _read(previous)

    def _flag(self, params: list[torch.nn.Parameter], norm: torch.Tensor | None) -> torch.Tensor:
        if norm is None and (self.full_norm or self.probe is None or self.probe.grad is None):
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        value = norm if norm is not None else self.probe.grad.sum()  # type: ignore[union-attr]
        return torch.isnan(value) if self.scaled else ~torch.isfinite(value)


def _to_host(flag: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
    host = torch.empty((), dtype=torch.bool, pin_memory=True)
    host.copy_(flag, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def _read(pending: tuple[torch.Tensor, torch.cuda.Event] | None) -> bool:
    if pending is None:
        return False
    host, event = pending
    event.synchronize()  # the step before this one: long finished, so this rarely waits
    return bool(host)


def message(step: int, ranks: list[int], skipped: int, latest: int | None, policy: str) -> str:
    """The one line every rank raises: what, where first, what was kept, what to try."""
    where = (
        f"the loss first on rank {ranks[0]}" + (f" (also ranks {ranks[1:]})" if ranks[1:] else "")
        if ranks
        else "the gradients (the loss was finite on every rank)"
    )
    why = f", after {skipped} skipped steps (train.nonfinite_max_skips)" if policy == "skip" else ""
    kept = f"checkpoint step {latest} is the latest" if latest is not None else "no checkpoint"
    return (
        f"non-finite (NaN/inf) values at step {step} in {where}{why}; every rank stopped at "
        f"that step without saving it, {kept}. HINT: lower optim.lr, set optim.grad_clip_norm "
        "or optim.warmup_steps, check the data; train.nonfinite=skip skips such steps."
    )
