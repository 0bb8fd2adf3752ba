"""``hpcddp checkpoint inspect`` lists whole and sharded checkpoints (torn ones as torn), and
``export`` writes the newest complete one's model weights whole, equal to what was saved."""

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from hpcddp.errors import CheckpointError
from hpcddp.storage.checkpoint import CheckpointStore
from hpcddp.storage.checkpoint_tools import export, inventory
from hpcddp.storage.sharded import ShardedStore

SHAPE = {"world_size": 2, "strategy": "fsdp", "batch_size": 2, "grad_accum_steps": 1}


def _weights(value: float) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(int(value))
    return {
        "layer.weight": torch.randn(4, 3, generator=generator),
        "layer.bias": torch.full((4,), value),
    }


def _sharded(tmp_path, step: int, weights: dict[str, torch.Tensor]) -> None:
    store = ShardedStore(tmp_path)
    path = store.open(step)
    state = {
        "model": weights,
        "optimizer": {"state": {"layer.weight": {"exp_avg": weights["layer.weight"] * 2}}},
    }
    dcp.save(state, checkpoint_id=path, no_dist=True)
    store.complete(step, SHAPE)


def test_inspect_lists_every_kind_and_the_torn(tmp_path):
    CheckpointStore(tmp_path).save(2, {"model": _weights(2), "world_size": 4})
    _sharded(tmp_path, 4, _weights(4))
    ShardedStore(tmp_path).open(6)  # torn: a save that never finished
    found = inventory(tmp_path, verify=True)
    assert [(f.step, f.kind, f.complete, f.world_size) for f in found] == [
        (2, "whole", True, 4),
        (4, "sharded", True, 2),
        (6, "sharded", False, None),
    ]
    assert [f.integrity for f in found] == [
        "digest ok",
        "file sizes ok, 2 digests ok",
        "no marker: torn, never loaded",
    ]


def test_inspect_counts_an_earlier_versions_sidecar_as_complete(tmp_path):
    CheckpointStore(tmp_path).save(2, {"model": _weights(2), "world_size": 1})
    folder = tmp_path / "checkpoints"
    (folder / "step-00000002.pt.xxh3").rename(folder / "step-00000002.pt.sha256")  # older name
    (found,) = inventory(tmp_path, verify=True)
    assert (found.complete, found.integrity) == (True, "digest ok")


@pytest.mark.parametrize("newest", ["whole", "sharded"])
def test_export_writes_the_newest_complete_models_weights(tmp_path, newest):
    CheckpointStore(tmp_path).save(2, {"model": _weights(2), "world_size": 2})
    if newest == "sharded":
        _sharded(tmp_path, 4, _weights(4))
    ShardedStore(tmp_path).open(6)  # torn: never exported
    out = tmp_path / "model.safetensors"
    found, tensors = export(tmp_path, out)
    expected = _weights(4 if newest == "sharded" else 2)
    assert (found.step, found.kind, tensors) == (4 if newest == "sharded" else 2, newest, 2)
    written = load_file(out)
    assert written.keys() == expected.keys()  # the model alone, no optimizer state
    for name, tensor in expected.items():
        assert torch.equal(written[name], tensor)


def test_export_without_a_complete_checkpoint_says_so(tmp_path):
    ShardedStore(tmp_path).open(2)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        export(tmp_path, tmp_path / "model.safetensors")
