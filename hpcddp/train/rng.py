"""Every random state a run depends on, as tensors and lists that load under weights_only=True.

numpy's ``get_state()`` tuple is refused by ``torch.load(weights_only=True)``, and exact resume
needs each rank's own states, so they are converted to plain data here and back.
"""

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (all devices) from one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture() -> dict:
    """This process's RNG states as weights_only-safe data."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    """Put back the states that `capture` took."""
    torch.set_rng_state(state["torch"])
    npy = state["numpy"]
    np.random.set_state(
        (
            npy["kind"],
            npy["keys"].numpy().astype(np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["gauss"],
        )
    )
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
