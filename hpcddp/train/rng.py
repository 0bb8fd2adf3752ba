"""Every random state a run depends on, as tensors and lists that load under weights_only=True.

numpy's ``get_state()`` tuple is refused by ``torch.load(weights_only=True)``, and exact resume
needs each rank's own states, so they are converted to plain data here and back.

CUDA's state is the rank's own device's only: a rank draws from no other GPU, and the set of
visible GPUs may change between attempts (4 visible, then ``--gpus-per-task=1``), so a list
indexed by visible device would name devices that no longer exist, or the wrong ones.
"""

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (all devices) from one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture(device: torch.device | None = None) -> dict:
    """This process's RNG states as weights_only-safe data (CUDA: ``device``'s alone)."""
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
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore(state: dict, device: torch.device | None = None, local_rank: int = 0) -> None:
    """Put back the states that `capture` took; CUDA's onto ``device``.

    Checkpoints from before hold a list with every visible GPU's state; the rank drew from
    the one it was bound to then, ``local_rank % len(list)`` (the binding rule of that time).
    """
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
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(own_cuda_state(state["cuda"], local_rank), device)


def own_cuda_state(saved: torch.Tensor | list[torch.Tensor], local_rank: int) -> torch.Tensor:
    """The state this rank's GPU had, from a checkpoint of either format."""
    if isinstance(saved, torch.Tensor):
        return saved
    return saved[local_rank % len(saved)]
