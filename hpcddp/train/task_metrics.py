"""Evaluation metrics as sums and counts, so figures reduced over ranks are exact.

Every metric is a pair (sum, count) per batch; pairs add up across batches and then across
ranks, and only the job-wide totals are divided. An average of per-rank averages would weigh
a rank's short last shard like a full one. Built-ins by ``task.kind``:

- classification: loss and accuracy, per sample, or per token for (B, T, V) outputs (targets
  equal to -100 are left out, as in the loss);
- regression: loss, mse and mae, per target element;
- language_modeling: loss per token and perplexity = exp(loss). An HF causal LM's own loss is
  the mean over ``labels[..., 1:]`` (it shifts inside), so that is what it is weighted by.
"""

import math
from collections.abc import Mapping
from typing import Any

import torch

from hpcddp.train import batches
from hpcddp.train.task import IGNORE_INDEX, Task

Totals = dict[str, list[float]]  # name: [sum, count]


def score(task: Task, output: Any, batch: Any, targets: Any) -> dict[str, tuple[Any, Any]]:
    """This batch's (sum, count) per built-in metric of ``task.kind``."""
    own = batches.output_loss(output)
    loss = own if own is not None else task.loss_of(output, targets)
    if targets is None:  # an output that scores itself: its loss is all there is
        return {"loss": (loss.detach().double(), 1)}
    if task.kind == "regression":
        return _regression(loss, batches.logits_of(output), targets)
    counted = targets != IGNORE_INDEX
    weight = counted.sum()
    if own is not None and task.kind == "language_modeling" and _shifted(batch, output):
        weight = counted[..., 1:].sum()
    scores = {"loss": (loss.detach().double() * weight, weight)}
    if task.kind == "classification":
        predicted = batches.logits_of(output).argmax(-1)
        correct = ((predicted == targets) & counted).sum()
        scores["accuracy"] = (correct, counted.sum())
    return scores


def _shifted(batch: Any, output: Any) -> bool:
    """An HF causal LM given ``labels`` shifts them itself (logits and labels share T)."""
    return isinstance(batch, Mapping) and "labels" in batch and not isinstance(output, torch.Tensor)


def _regression(loss: torch.Tensor, predicted: torch.Tensor, targets: torch.Tensor) -> dict:
    if predicted.dim() == targets.dim() + 1 and predicted.size(-1) == 1:
        predicted = predicted.squeeze(-1)
    error = predicted.double() - targets.double()
    n = targets.numel()
    return {
        "loss": (loss.detach().double() * n, n),
        "mse": (error.square().sum(), n),
        "mae": (error.abs().sum(), n),
    }


def add(totals: dict[str, list[Any]], scores: Mapping[str, tuple[Any, Any]]) -> None:
    """Add one batch's (sum, count) pairs; tensors stay on the device (no sync per batch)."""
    for name, (total, count) in scores.items():
        if name in totals:
            totals[name][0] = totals[name][0] + total
            totals[name][1] = totals[name][1] + count
        else:
            totals[name] = [total, count]


def as_floats(totals: dict[str, list[Any]]) -> Totals:
    """Plain numbers (one device sync for the whole evaluation)."""
    return {name: [float(s), float(c)] for name, (s, c) in totals.items()}


def merge(per_rank: list[Totals]) -> Totals:
    """Every rank's totals added, in rank order (the same result on every rank)."""
    merged: Totals = {}
    for totals in per_rank:
        for name, (total, count) in totals.items():
            pair = merged.setdefault(name, [0.0, 0.0])
            pair[0] += total
            pair[1] += count
    return merged


def finish(totals: Totals, kind: str) -> dict[str, float]:
    """``eval_<name>`` = sum / count; perplexity for language modelling."""
    result = {f"eval_{name}": total / count for name, (total, count) in totals.items() if count}
    if kind == "language_modeling" and "eval_loss" in result:
        result["eval_perplexity"] = math.exp(min(result["eval_loss"], 700.0))  # no overflow
    return result
