"""A resume's one read: weights read straight into the model while the digest is checked."""

import hashlib

import pytest
import torch

from hpcddp.errors import CheckpointError
from hpcddp.storage import into_place, mapped
from hpcddp.storage.checkpoint import CheckpointStore


class Tied(torch.nn.Module):
    """Tied weights, a bf16 parameter, a buffer and a 0-d tensor: what real models carry."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.head = torch.nn.Linear(16, 64, bias=False)
        self.head.weight = self.embed.weight
        self.low = torch.nn.Parameter(torch.randn(8, 8).to(torch.bfloat16))
        self.register_buffer("scale", torch.tensor(3.0))


def saved(tmp_path):
    model = Tied()
    store = CheckpointStore(tmp_path)
    return model, store, store.save(1, {"model": model.state_dict(), "step": 1})


def place(store, path, model):
    """What local rank 0's resume does: map, read in place while verifying, copy the rest."""
    loaded = store.load_verified(path)["model"]
    weights = model.state_dict()
    pieces = into_place.pieces(path, weights, loaded)
    placed = store.verify(path, pieces)
    assert mapped.copy_into(weights, loaded, {p.key for p in pieces} if placed else ())
    return pieces, placed


def test_the_verifying_read_puts_every_weight_in_place_once(tmp_path):
    model, store, path = saved(tmp_path)
    fresh = Tied()
    loaded = store.load_verified(path)["model"]
    pieces = into_place.pieces(path, fresh.state_dict(), loaded)
    assert store.verify(path, pieces)  # filled by the read itself, before any copy
    for key, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], tensor), key
    keys = [p.key for p in pieces]
    assert len(keys) == 3 and ("embed.weight" in keys) != ("head.weight" in keys)  # tied: once
    offsets = [p.offset for p in pieces]
    assert offsets == sorted(offsets)
    data = path.read_bytes()
    for piece in pieces:  # each piece is where the file holds that tensor's bytes
        expected = model.state_dict()[piece.key].reshape(-1).view(torch.uint8).numpy().tobytes()
        assert data[piece.offset : piece.offset + len(expected)] == expected


def test_a_weight_the_read_does_not_place_is_copied_and_the_model_still_matches(tmp_path):
    model, store, path = saved(tmp_path)
    fresh = Tied()
    fresh.low = torch.nn.Parameter(torch.zeros(8, 8))  # float32 now: not read in place
    pieces, placed = place(store, path, fresh)
    assert placed and "low" not in {p.key for p in pieces}
    assert torch.equal(fresh.low, model.low.float())
    assert torch.equal(fresh.embed.weight, model.embed.weight)


@pytest.mark.parametrize("damage", ["flip a weight's byte", "truncate"])
def test_a_damaged_file_is_refused_by_the_read_that_places_it(tmp_path, damage):
    _, store, path = saved(tmp_path)
    fresh = Tied()
    loaded = store.load_verified(path)["model"]
    pieces = into_place.pieces(path, fresh.state_dict(), loaded)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        del data[pieces[-1].offset + 8 :]
    else:
        data[pieces[0].offset + 5] ^= 0x10
    with open(path, "r+b") as handle:  # in place: the mapping above still views this file
        handle.write(data)
        handle.truncate(len(data))
    with pytest.raises(CheckpointError, match="is corrupt"):
        store.verify(path, pieces)


def test_an_older_sha256_checkpoint_is_verified_and_copied_as_before(tmp_path):
    model, store, path = saved(tmp_path)
    path.with_name(path.name + ".xxh3").unlink()  # as the first versions left it
    sidecar = path.with_name(path.name + ".sha256")
    sidecar.write_text(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n")
    fresh = Tied()
    _, placed = place(store, path, fresh)
    assert not placed
    for key, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], tensor), key


def test_a_tensor_not_mapped_from_the_file_has_no_offset(tmp_path):
    _, store, path = saved(tmp_path)
    loaded = store.load_verified(path)["model"]
    assert into_place.file_offsets(path, [torch.ones(3), loaded["low"]])[0] is None
    assert into_place.file_offsets(path, [loaded["low"]])[0] is not None
