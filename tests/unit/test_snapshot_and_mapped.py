"""Host snapshots for background writes, and mapped loads that let go of pages as they go."""

import psutil
import pytest
import torch

from hpcddp.storage import mapped
from hpcddp.storage.checkpoint import CheckpointStore
from hpcddp.storage.snapshot import Snapshot
from tests.fixtures.checkpoints import read


def test_a_snapshot_is_a_copy_that_reuses_its_buffers_and_keeps_ties():
    weight = torch.randn(4, 4)
    state = {"model": {"a": weight, "tied": weight}, "opt": [torch.ones(3), 7], "note": "x"}
    snapshot = Snapshot()
    first = snapshot.take(state)
    assert first["model"]["a"] is first["model"]["tied"]  # tied weights stay one tensor
    assert torch.equal(first["model"]["a"], weight) and first["opt"][1] == 7
    weight.add_(1)  # training moves on: the copy does not
    assert not torch.equal(first["model"]["a"], weight)
    buffer = first["model"]["a"]
    second = snapshot.take(state)
    assert second["model"]["a"] is buffer and torch.equal(buffer, weight)  # refilled, not new
    assert snapshot.nbytes == (16 + 3) * 4


def test_a_mapped_load_copies_into_a_module_and_materializes_the_rest(tmp_path):
    model, fresh = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    store = CheckpointStore(tmp_path)
    path = store.save(1, {"model": model.state_dict(), "opt": {"m": torch.arange(5.0)}})
    state = read(store, path)
    assert mapped.copy_into(fresh.state_dict(), state["model"])
    assert torch.equal(fresh.weight, model.weight)
    opt = mapped.materialize(state["opt"])
    assert torch.equal(opt["m"], torch.arange(5.0))
    assert opt["m"].untyped_storage().data_ptr() != state["opt"]["m"].untyped_storage().data_ptr()
    assert not mapped.copy_into(torch.nn.Linear(8, 5).state_dict(), state["model"])  # shapes


def test_released_pages_leave_the_process(tmp_path):
    """64 MB mapped and read: resident; released: gone again (the page cache keeps them)."""
    store = CheckpointStore(tmp_path)
    path = store.save(1, {"big": torch.ones(16 << 20)})
    big = read(store, path)["big"]
    process = psutil.Process()
    before = process.memory_info().rss
    assert big.sum().item() == 16 << 20  # touch every page
    touched = process.memory_info().rss
    mapped.release(big)
    after = process.memory_info().rss
    assert touched - before > 48e6
    assert touched - after > 48e6
    assert big[-1].item() == 1.0  # still readable: the page comes back from the file


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_verification_reads_in_chunks_and_still_catches_damage(tmp_path, damage, monkeypatch):
    from hpcddp.errors import CheckpointError
    from hpcddp.storage import digest

    monkeypatch.setattr(digest, "READ_BYTES", 4096)
    store = CheckpointStore(tmp_path)
    path = store.save(1, {"w": torch.randn(10_000)})
    store.verify(path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        del data[-5000:]
    else:
        data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="is corrupt"):
        store.verify(path)


def test_prepared_buffers_are_the_ones_the_first_take_fills():
    weight = torch.randn(8)
    state = {"model": {"a": weight, "tied": weight}, "optimizer": {"m": torch.zeros(2)}}
    snapshot = Snapshot()
    snapshot.prepare(state)
    assert snapshot.nbytes == (8 + 2) * 4  # the tied tensor is prepared once
    buffers = dict(snapshot._buffers)
    copy = snapshot.take(state)
    assert copy["model"]["a"] is buffers[("model", "a")] and torch.equal(copy["model"]["a"], weight)
