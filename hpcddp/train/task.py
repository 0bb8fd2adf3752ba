"""What is learned: where the loss comes from, and how a model's outputs are scored.

The loss of a batch is the first of:

1. a ``training_step(model, batch) -> loss`` hook: ``task.training_step`` in the config, else a
   ``training_step`` method of your model (called as ``module.training_step(model, batch)``).
   ``model`` is the DDP-wrapped model: call it for the forward pass, so gradients synchronize;
2. a ``compute_loss(outputs, targets)`` method of your model;
3. the output's own loss (``output.loss`` / ``output["loss"]``: HF models given ``labels``);
4. the configured loss (``task.loss``, else the default of ``task.kind``) on
   (the output's logits, the targets).

Evaluation is the same walk with ``eval_step(model, batch) -> {name: (sum, count)}``
(config, then model method) replacing the built-in metrics of ``task.kind``.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from hpcddp.config import TaskConfig
from hpcddp.errors import ConfigError
from hpcddp.train import batches
from hpcddp.train.factories import import_factory

IGNORE_INDEX = -100  # targets to leave out of the loss (padding), as PyTorch and HF do


def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross entropy over the last dimension; sequence outputs (B, T, V) are flattened."""
    if outputs.dim() > 2:
        outputs, targets = outputs.reshape(-1, outputs.size(-1)), targets.reshape(-1)
    return F.cross_entropy(outputs, targets, ignore_index=IGNORE_INDEX)


def _same_shape(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (B, 1) prediction against (B,) targets is the usual regression shape slip."""
    if outputs.dim() == targets.dim() + 1 and outputs.size(-1) == 1:
        outputs = outputs.squeeze(-1)
    return outputs.float(), targets.to(outputs.dtype).float()


def mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error."""
    return F.mse_loss(*_same_shape(outputs, targets))


def l1(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean absolute error."""
    return F.l1_loss(*_same_shape(outputs, targets))


LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "cross_entropy": cross_entropy,
    "mse": mse,
    "l1": l1,
}
DEFAULT_LOSS = {"classification": "cross_entropy", "regression": "mse"}


@dataclasses.dataclass
class Task:
    """The loss and metric hooks of one run, resolved once from the config and the model."""

    kind: str
    loss_fn: Callable[..., torch.Tensor]
    training_step: Callable[..., torch.Tensor] | None = None
    compute_loss: Callable[..., torch.Tensor] | None = None
    eval_step: Callable[..., dict] | None = None

    @classmethod
    def resolve(cls, cfg: TaskConfig, module: torch.nn.Module) -> "Task":
        """Config hooks first, then the model's own methods, then the built-ins."""
        name = cfg.loss or DEFAULT_LOSS.get(cfg.kind, "cross_entropy")
        loss_fn = LOSSES[name] if name in LOSSES else import_factory(name, "task.loss")
        return cls(
            kind=cfg.kind,
            loss_fn=loss_fn,
            training_step=_hook(cfg.training_step, module, "training_step"),
            compute_loss=getattr(module, "compute_loss", None),
            eval_step=_hook(cfg.eval_step, module, "eval_step"),
        )

    def loss(self, model: Any, module: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The training loss of ``batch``: ``model`` runs the forward, ``module`` is unwrapped."""
        if self.training_step is not None:
            return _checked(self.training_step(model, batch), "training_step")
        fed = batches.feed(batch, module)
        return self.loss_of(model(*fed.args, **fed.kwargs), fed.targets)

    def loss_of(self, output: Any, targets: Any) -> torch.Tensor:
        """Steps 2 to 4 of the module docstring, for an output already computed."""
        if self.compute_loss is not None and targets is not None:
            return self.compute_loss(output, targets)
        own = batches.output_loss(output)
        if own is not None:
            return own
        if targets is None:
            raise ConfigError(
                f"no loss for an output of type {type(output).__name__}: the batch has no "
                "targets and the output no 'loss'. HINT: yield (inputs, targets) or a dict "
                "with 'labels', or define training_step(model, batch) -> loss."
            )
        return self.loss_fn(batches.logits_of(output), targets)


def _hook(path: str, module: torch.nn.Module, name: str) -> Callable[..., Any] | None:
    if path:
        return import_factory(path, f"task.{name}")
    method = getattr(module, name, None)
    return method if callable(method) else None


def _checked(loss: Any, hook: str) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ConfigError(
            f"{hook} returned {type(loss).__name__}, not a one-element loss tensor. "
            f"HINT: make {hook}(model, batch) return the scalar loss to minimize."
        )
    return loss
