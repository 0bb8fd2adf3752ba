"""The sharded reader reads a stored tensor straight into the model's when it can (its layout
seen earlier in the load, the model's tensor a fit): the loaded state must be exactly the
saved one, every byte still checked against the file's digest.

One process, no process group: DCP's own save, hpcddp's reader for the load."""

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from hpcddp.errors import CheckpointError
from hpcddp.storage.sharded import digests_of
from hpcddp.storage.sharded_reader import VerifyingReader


def _state(seed: int) -> dict:
    """Blocks of one layout (the model's and both AdamW moments), a bias, a step count."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*(torch.nn.Linear(96, 96) for _ in range(4)))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 96)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optim": optimizer.state_dict()["state"]}


def _saved(path) -> tuple[dict, dict[str, str]]:
    state = _state(0)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=path, no_dist=True)
    return state, digests_of(path, sorted(p.name for p in path.iterdir()))


def _load(path, digests) -> tuple[dict, VerifyingReader]:
    state, reader = _state(1), VerifyingReader(path, digests)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state, reader


def _flat(state: dict) -> dict[str, torch.Tensor]:
    model = {f"model.{k}": v for k, v in state["model"].items()}
    moments = {f"optim.{i}.{k}": v for i, s in state["optim"].items() for k, v in s.items()}
    return model | moments


def test_tensors_read_in_place_are_the_saved_ones(tmp_path):
    saved, digests = _saved(tmp_path)
    loaded, reader = _load(tmp_path, digests)
    assert reader.placed == 11  # of the 4 x 3 weight matrices, all but the first (unpickled)
    for key, tensor in _flat(saved).items():
        assert torch.equal(_flat(loaded)[key], tensor), key


def test_a_flipped_byte_in_a_tensor_read_in_place_fails_the_files_digest(tmp_path):
    _, digests = _saved(tmp_path)
    shard = tmp_path / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-len(data) // 4] ^= 0x01  # inside one of the last weights: read in place
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointException) as failed:  # DCP's, around each rank's error
        _load(tmp_path, digests)
    cause = failed.value.failures[0][0]
    assert isinstance(cause, CheckpointError)
    assert "__0_0.distcp does not match its digest" in str(cause)
