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

Under fp16 a NaN/inf gradient is GradScaler's overflow: at its first scales it overflows on
purpose (inf - inf inside attention and LayerNorm backward gives NaN), skips that step and
lowers the scale. Such a step is counted as ``overflow_steps``, never as a non-finite step.
Only a non-finite loss before scaling (each rank's own flag, one small MAX all-reduce a step)
or a scale that fell below `SCALE_FLOOR` after `OVERFLOW_RUN` overflows in a row stops the run.
"""

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from hpcddp.config import TrainConfig
from hpcddp.train.state import Progress

log = logging.getLogger(__name__)

# A loss scale below this after OVERFLOW_RUN skipped steps in a row: the gradients are not
# finite even unscaled, so the run has diverged (65536 halves below 1/256 in 25 skips).
SCALE_FLOOR = 2.0**-8
OVERFLOW_RUN = 25


@dataclasses.dataclass(frozen=True)
class Seen:
    """What the guard found about one step (read at once, or one step late on CUDA)."""

    step: int
    nonfinite: bool  # a non-finite loss on some rank, or (unscaled) non-finite gradients
    own_loss: bool  # this rank's own loss was the non-finite one
    overflow: bool = False  # fp16: GradScaler skipped the step (its found_inf), loss finite


class Guard:
    """One rank's side of the guard and the whole NaN policy (see the module docstring)."""

    def __init__(
        self,
        cfg: TrainConfig,
        device_type: str,
        scaled: bool,
        distributed: bool = False,
        late_copy: "Callable[[torch.Tensor, int], Late] | None" = None,
    ) -> None:
        self.policy, self.max_skips = cfg.nonfinite, cfg.nonfinite_max_skips
        self.full_norm = cfg.nonfinite_grad_norm
        self.scaled = scaled  # fp16: gradients may overflow on purpose; the loss decides
        self.distributed = distributed
        self.lagged = device_type == "cuda" and self.policy == "stop"
        self.probe: torch.nn.Parameter | None = None
        self._late_copy = late_copy or PinnedCopy  # how a lagged finding waits to be read
        self._pending: Late | None = None
        self._own: torch.Tensor | None = None  # this step's own loss was not finite
        self.overflows_in_a_row = 0
        self.stopped: Seen | None = None  # the step that ended the run
        self.collapsed_scale: float | None = None  # when a collapsing fp16 scale ended it

    @property
    def active(self) -> bool:
        """False with ``train.nonfinite=off``."""
        return self.policy != "off"

    def seeded(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times 1.0 (finite) or NaN (not), so every rank's gradients show it."""
        if not self.active:
            return loss
        finite = torch.isfinite(loss.detach())
        self._own = ~finite if self._own is None else self._own | ~finite
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

    # -- looking, after the gradient all-reduce and before the optimizer ---------------------

    def look(
        self, params: list[torch.nn.Parameter], norm: torch.Tensor | None, step: int
    ) -> tuple[bool, Seen | None]:
        """Unscaled: (skip this step's optimizer now?, what was found about a step).

        ``norm`` is the total gradient norm when it was computed anyway (clipping). Under
        ``lagged`` nothing is skipped now and the finding is the previous step's.
        """
        if not self.active:
            return False, None
        bad = self._gradient_flag(params, norm)
        flags = torch.stack([bad, self._own_flag(bad.device)])
        return self._found(flags.float(), step)

    def look_scaled(self, found_inf: torch.Tensor, step: int) -> Seen | None:
        """fp16: was this step (or, lagged, the previous one) non-finite, or an overflow?

        ``found_inf`` is GradScaler's, the same on every rank (it looks at all-reduced
        gradients). A non-finite loss is known only to its rank: a MAX all-reduce tells all.
        The scaler skips such a step by itself (the seeded NaN makes its found_inf true).
        """
        own = self._own_flag(found_inf.device).float()
        anywhere = own.clone()
        if self.active and self.distributed:
            dist.all_reduce(anywhere, op=dist.ReduceOp.MAX)
        overflow = (found_inf.reshape(()).float() > 0) & (anywhere == 0)
        flags = torch.stack([anywhere, own, overflow.float()])
        return self._found(flags, step)[1]

    def settle(self) -> Seen | None:
        """The pending lagged finding, read now (before a checkpoint, at the end)."""
        previous, self._pending = self._pending, None
        return previous.read() if previous is not None else None

    def _found(self, flags: torch.Tensor, step: int) -> tuple[bool, Seen | None]:
        self._own = None
        if not self.lagged:
            seen = _seen(flags.tolist(), step)
            return seen.nonfinite, seen
        previous, self._pending = self._pending, self._late_copy(flags, step)
        return False, previous.read() if previous is not None else None

    def _own_flag(self, device: torch.device) -> torch.Tensor:
        own = self._own if self._own is not None else torch.zeros((), dtype=torch.bool)
        return own.to(device)

    def _gradient_flag(
        self, params: list[torch.nn.Parameter], norm: torch.Tensor | None
    ) -> torch.Tensor:
        if norm is None and (self.full_norm or self.probe is None or self.probe.grad is None):
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        value = norm if norm is not None else self.probe.grad.sum()  # type: ignore[union-attr]
        return ~torch.isfinite(value)

    # -- the policy --------------------------------------------------------------------------

    def judge(
        self, seen: Seen | None, progress: Progress, scale: Callable[[], float | None] | None = None
    ) -> bool:
        """Count what was seen in ``progress``; True when the run must stop (every rank alike).

        A non-finite step is skipped (``skip``, up to ``max_skips``) or ends the run; an fp16
        overflow is only counted, unless the scale (``scale()``) collapsed below the floor.
        """
        if seen is None:
            return False
        if seen.overflow:
            progress.overflow_steps += 1
            self.overflows_in_a_row += 1
            return self._collapsed(seen, scale)
        self.overflows_in_a_row = 0
        if not seen.nonfinite:
            return False
        progress.skipped_steps += 1
        if self.policy == "skip" and progress.skipped_steps <= self.max_skips:
            log.warning(
                "step %d: non-finite loss or gradients, step skipped (%d so far)",
                seen.step,
                progress.skipped_steps,
            )
            return False
        self.stopped = seen
        return True

    def _collapsed(self, seen: Seen, scale: Callable[[], float | None] | None) -> bool:
        if not self.active or self.overflows_in_a_row < OVERFLOW_RUN or scale is None:
            return False
        now = scale()
        if now is None or now >= SCALE_FLOOR:
            return False
        self.stopped, self.collapsed_scale = seen, now
        return True


def _seen(values: list[float], step: int) -> Seen:
    overflow = len(values) > 2 and values[2] > 0
    return Seen(step=step, nonfinite=values[0] > 0, own_loss=values[1] > 0, overflow=overflow)


class Late:
    """A finding copied off the device without waiting: read after the next step."""

    def read(self) -> Seen:
        """The finding (waits for the copy, long finished by then)."""
        raise NotImplementedError


class PinnedCopy(Late):
    """CUDA: the flags copied to pinned host memory behind an event, no sync per step."""

    def __init__(self, flags: torch.Tensor, step: int) -> None:
        self.step = step
        self.host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
        self.host.copy_(flags, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def read(self) -> Seen:
        """Wait for the step before this one (long finished, so this rarely waits)."""
        self.event.synchronize()
        return _seen(self.host.tolist(), self.step)


def message(
    step: int,
    ranks: list[int],
    skipped: int,
    latest: int | None,
    policy: str,
    collapsed_scale: float | None = None,
) -> str:
    """The one line every rank raises: what, where first, what was kept, what to try."""
    where = (
        f"the loss first on rank {ranks[0]}" + (f" (also ranks {ranks[1:]})" if ranks[1:] else "")
        if ranks
        else "the gradients (the loss was finite on every rank)"
    )
    if collapsed_scale is not None:
        where = (
            f"the gradients: the fp16 loss scale fell to {collapsed_scale:.3g} after "
            f"{OVERFLOW_RUN}+ overflow steps in a row"
        )
    why = f", after {skipped} skipped steps (train.nonfinite_max_skips)" if policy == "skip" else ""
    kept = f"checkpoint step {latest} is the latest" if latest is not None else "no checkpoint"
    return (
        f"non-finite (NaN/inf) values at step {step} in {where}{why}; every rank stopped at "
        f"that step without saving it, {kept}. HINT: lower optim.lr, set optim.grad_clip_norm "
        "or optim.warmup_steps, check the data; train.nonfinite=skip skips such steps."
    )
