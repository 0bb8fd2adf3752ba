"""What does not fit when a checkpoint's weights are loaded into a model, in one line.

``load_state_dict`` answers a mismatch with every missing and unexpected key and every shape,
hundreds of lines for a large model. A user who resumed into the wrong run directory needs the
first parameter that differs (its name, the checkpoint's shape and the model's), a few of the
keys on either side, and the fix.
"""

from collections.abc import Mapping
from typing import Any

import torch

_SHOWN_KEYS = 3


def describe(model: Mapping[str, torch.Tensor], loaded: Mapping[str, Any]) -> str | None:
    """How ``loaded`` (a checkpoint's model state) misfits ``model``'s state dict; None if it fits.

    Parameters are compared in the model's order, so "first" is the first layer that differs.
    """
    parts = []
    for name, tensor in model.items():
        other = loaded.get(name)
        if isinstance(other, torch.Tensor) and other.shape != tensor.shape:
            parts.append(
                f"first mismatched parameter {name!r}: checkpoint {_shape(other)} vs model "
                f"{_shape(tensor)}"
            )
            break
    missing = [name for name in model if name not in loaded]
    unexpected = [name for name in loaded if name not in model]
    if missing:
        parts.append(f"missing from the checkpoint: {_some(missing)}")
    if unexpected:
        parts.append(f"not in the model: {_some(unexpected)}")
    return "; ".join(parts) or None


def _shape(tensor: torch.Tensor) -> str:
    return f"({', '.join(map(str, tensor.shape))})"


def _some(names: list[str]) -> str:
    more = f" and {len(names) - _SHOWN_KEYS} more" if len(names) > _SHOWN_KEYS else ""
    return ", ".join(names[:_SHOWN_KEYS]) + more
