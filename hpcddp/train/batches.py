"""Batches and outputs of any shape: moved to the device, fed to the model, read back.

A batch may be a tensor, a tuple or list, a dict (an HF `BatchEncoding` is a Mapping), a
namedtuple, a dataclass, or any nesting of these; every tensor in it moves to the device. How a
batch meets the model follows the conventions people already use:

- a Mapping is passed as keyword arguments, ``model(**batch)`` (every HF model); keys the
  model's ``forward`` does not take (``labels`` for a plain module) are kept back as targets;
- a pair ``(inputs, targets)`` is ``model(inputs)``, as in the PyTorch tutorials;
- a lone tensor (or 1-tuple) is ``model(inputs)``, with no targets;
- anything else needs a ``training_step`` hook (see `hpcddp.train.task`).

Outputs may be a tensor, a tuple, a dict or an HF ``ModelOutput`` (a dataclass and a Mapping):
`output_loss` finds an output's own loss, `logits_of` its main tensor.
"""

import dataclasses
import functools
import inspect
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import torch

from hpcddp.errors import ConfigError

TARGET_KEYS = ("labels", "label", "targets", "target")


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor on ``device``; copies from pinned memory do not block."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=batch.is_pinned())
    if isinstance(batch, Mapping) and not dataclasses.is_dataclass(batch):
        moved = {k: to_device(v, device) for k, v in batch.items()}
        return _rebuild(batch, moved)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = {f.name: to_device(getattr(batch, f.name), device) for f in _init_fields(batch)}
        return type(batch)(**fields)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def _rebuild(original: Mapping, moved: dict) -> Any:
    """The same kind of mapping when its class can be built from a dict (BatchEncoding can)."""
    if type(original) is dict:
        return moved
    try:
        return type(original)(moved)  # type: ignore[call-arg]
    except TypeError:
        return moved


def _init_fields(obj: Any) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(obj) if f.init]


class Fed(NamedTuple):
    """How one batch is given to the model: positional and keyword inputs, and targets."""

    args: tuple
    kwargs: dict
    targets: Any


def feed(batch: Any, module: torch.nn.Module) -> Fed:
    """Split ``batch`` into the model's inputs and the targets (see the module docstring)."""
    if isinstance(batch, Mapping):
        accepted = _accepted_keywords(type(module).__qualname__, type(module).forward)
        if accepted is None:
            return Fed((), dict(batch), _targets_in(batch))
        kwargs = {k: v for k, v in batch.items() if k in accepted}
        kept_back = {k: v for k, v in batch.items() if k not in accepted}
        return Fed((), kwargs, _targets_in(kept_back) if kept_back else _targets_in(batch))
    if isinstance(batch, torch.Tensor):
        return Fed((batch,), {}, None)
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields") and len(batch) in (1, 2):
        return Fed((batch[0],), {}, batch[1] if len(batch) == 2 else None)
    raise ConfigError(
        f"a batch of type {type(batch).__name__} cannot be fed to the model: hpcddp passes a "
        "dict as keyword arguments, (inputs, targets) positionally, a tensor as is. HINT: "
        "define training_step(model, batch) -> loss on your model, or set task.training_step."
    )


def _targets_in(batch: Mapping) -> Any:
    return next((batch[k] for k in TARGET_KEYS if k in batch), None)


@functools.cache
def _accepted_keywords(name: str, forward: Any) -> frozenset[str] | None:
    """Keyword names ``forward`` takes; None when it takes ``**kwargs`` (so, all)."""
    try:
        params = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY)


def output_loss(output: Any) -> torch.Tensor | None:
    """The loss an output carries itself (``output.loss`` or ``output["loss"]``, the HF way)."""
    if isinstance(output, Mapping):
        loss = output.get("loss")
    elif dataclasses.is_dataclass(output):
        loss = getattr(output, "loss", None)
    else:
        return None
    return loss if isinstance(loss, torch.Tensor) else None


def logits_of(output: Any) -> torch.Tensor:
    """The output's main tensor: itself, its ``logits``, else its first tensor that is no loss."""
    if isinstance(output, torch.Tensor):
        return output
    named = _named_tensors(output)
    if "logits" in named:
        return named["logits"]
    found = next((t for k, t in named.items() if k != "loss"), None)
    if found is None:
        raise ConfigError(
            f"the model's output ({type(output).__name__}) holds no tensor to score. HINT: "
            "return the logits (or a dict/ModelOutput with 'logits'), or set task.eval_step."
        )
    return found


def _named_tensors(output: Any) -> dict[str, torch.Tensor]:
    """Top-level tensors of an output, by name (tuples: by position, as '0', '1', ...)."""
    if isinstance(output, Mapping):
        items = list(output.items())
    elif dataclasses.is_dataclass(output):
        items = [(f.name, getattr(output, f.name)) for f in dataclasses.fields(output)]
    elif isinstance(output, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(output)]
    else:
        items = []
    return {str(k): v for k, v in items if isinstance(v, torch.Tensor)}


def tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a nested output, in order."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from tensors_in(value)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            yield from tensors_in(getattr(obj, field.name))
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from tensors_in(value)


def size_of(batch: Any) -> int:
    """Samples in a batch: the leading size of its first tensor (0 for none)."""
    first = next(tensors_in(batch), None)
    return int(first.shape[0]) if first is not None and first.dim() > 0 else 0


def tokens_of(batch: Any) -> int:
    """Tokens in a language-model batch (its ``input_ids``, padding included); 0 otherwise."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    return int(ids.numel()) if isinstance(ids, torch.Tensor) else 0
