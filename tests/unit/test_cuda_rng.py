"""Exact resume under another GPU binding: CUDA's RNG state is the rank's own device's.

No GPU here: a fake generator table stands in for ``torch.cuda.default_generators``, with
torch's own rules (an index past the visible devices raises IndexError, and the ``_all``
functions walk every visible device).
"""

import pytest
import torch

from hpcddp.train import rng


class GeneratorTable:
    """``count`` visible GPUs, each with a distinct 16-byte state."""

    def __init__(self, monkeypatch, count: int) -> None:
        self.states = [torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(count)]
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: count)
        monkeypatch.setattr(cuda, "get_rng_state", self.get)
        monkeypatch.setattr(cuda, "set_rng_state", self.set)
        monkeypatch.setattr(cuda, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        monkeypatch.setattr(cuda, "set_rng_state_all", self.set_all)

    @staticmethod
    def _index(device) -> int:
        return torch.device(device).index or 0 if not isinstance(device, int) else device

    def get(self, device="cuda") -> torch.Tensor:
        return self.states[self._index(device)].clone()  # IndexError past the visible ones

    def set(self, state, device="cuda") -> None:
        self.states[self._index(device)] = state.clone()

    def set_all(self, states) -> None:
        for index, state in enumerate(states):  # torch.cuda.set_rng_state_all's loop
            self.set(state, index)


def test_a_rank_saves_its_own_device_state_only(monkeypatch):
    GeneratorTable(monkeypatch, 4)
    state = rng.capture(torch.device("cuda:2"))
    assert torch.equal(state["cuda"], torch.full((16,), 12, dtype=torch.uint8))
    assert "cuda" not in rng.capture(torch.device("cpu"))  # a CPU rank on a GPU node


def test_four_visible_then_one_per_task_restores_the_state_that_rank_drew_from(monkeypatch):
    GeneratorTable(monkeypatch, 4)
    saved = rng.capture(torch.device("cuda:3"))  # local rank 3 of a node it saw whole
    resumed = GeneratorTable(monkeypatch, 1)  # --gpus-per-task=1: its GPU is cuda:0 now
    rng.restore(saved, torch.device("cuda:0"), local_rank=3)
    assert torch.equal(resumed.states[0], torch.full((16,), 13, dtype=torch.uint8))


def test_one_per_task_then_four_visible_restores_onto_the_bound_device(monkeypatch):
    GeneratorTable(monkeypatch, 1)
    saved = rng.capture(torch.device("cuda:0"))  # local rank 2, bound by Slurm to one GPU
    resumed = GeneratorTable(monkeypatch, 4)
    rng.restore(saved, torch.device("cuda:2"), local_rank=2)
    assert torch.equal(resumed.states[2], torch.full((16,), 10, dtype=torch.uint8))
    assert [int(s[0]) for s in resumed.states] == [10, 11, 10, 13]  # the others untouched


@pytest.mark.parametrize("visible_now, device, local_rank", [(1, "cuda:0", 3), (4, "cuda:3", 3)])
def test_an_old_checkpoint_with_every_device_still_loads(
    monkeypatch, visible_now, device, local_rank
):
    """Before: a list of every visible GPU's state; the rank had drawn from local_rank % 4."""
    old = GeneratorTable(monkeypatch, 4)
    saved = rng.capture(torch.device("cpu"))
    saved["cuda"] = [s.clone() for s in old.states]
    resumed = GeneratorTable(monkeypatch, visible_now)
    rng.restore(saved, torch.device(device), local_rank=local_rank)
    assert int(resumed.states[torch.device(device).index][0]) == 13
