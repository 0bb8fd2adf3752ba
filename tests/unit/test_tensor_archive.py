"""The sharded reader takes each stored tensor (a ``torch.save`` archive of one tensor) from its
bytes; a layout seen before is viewed in place instead of unpickled again, and must give the
very tensor that was saved, whatever its dtype, strides or offset in its storage."""

import io
import sys
import types

import pytest
import torch

from hpcddp.storage import tensor_archive
from hpcddp.storage.tensor_archive import HEAD, Layout, known_layout, stored_tensor

TENSORS = {
    "matrix": lambda: torch.randn(3, 4),
    "transposed": lambda: torch.randn(5, 6).t(),
    "view at an offset": lambda: torch.randn(10)[2:7],
    "int64": lambda: torch.arange(6, dtype=torch.int64),
    "scalar": lambda: torch.tensor(3.0),
    "bf16": lambda: torch.randn(2, 3).to(torch.bfloat16),
}


def _saved(tensor: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("kind", TENSORS)
def test_a_layout_seen_before_gives_the_saved_tensor(kind):
    layouts: dict = {}
    first, second = TENSORS[kind](), TENSORS[kind]()  # same layout, other values
    assert torch.equal(stored_tensor(_saved(first), layouts), first)
    assert len(layouts) == 1  # the second is read from its bytes, not unpickled
    again = stored_tensor(_saved(second), layouts)
    assert torch.equal(again, second) and again.dtype == second.dtype
    assert again.stride() == second.stride()


def test_an_archive_of_anything_else_is_left_to_torch_load():
    pair = [torch.ones(2), torch.zeros(3)]  # two storages: not one tensor's archive
    loaded = stored_tensor(_saved(pair), {})  # type: ignore[arg-type]
    assert isinstance(loaded, list) and torch.equal(loaded[1], pair[1])


@pytest.mark.parametrize("kind", TENSORS)
def test_an_archive_of_a_known_layout_has_the_tensors_bytes_right_after_its_prefix(kind):
    layouts: dict = {}
    stored_tensor(_saved(TENSORS[kind]()), layouts)  # learns the layout and its prefix
    later = TENSORS[kind]()  # same layout, other values, another save
    data = _saved(later)
    layout = known_layout(data[:HEAD], layouts)
    assert layout is not None and layout.nbytes == later.untyped_storage().nbytes()
    start = len(layout.prefix)
    assert data[start : start + layout.nbytes] == bytes(later.untyped_storage())


def test_an_archive_of_another_layout_is_not_known():
    layouts: dict = {}
    stored_tensor(_saved(torch.randn(64, 64)), layouts)
    for other in (torch.randn(64, 32), torch.randn(64, 64).double(), [torch.ones(2)]):
        assert known_layout(_saved(other)[:HEAD], layouts) is None


@pytest.mark.parametrize(
    ("kind", "whole"),
    [("matrix", True), ("transposed", False), ("view at an offset", False), ("scalar", True)],
)
def test_a_layout_is_whole_only_when_the_tensor_is_its_storage_in_order(kind, whole):
    assert Layout.of(TENSORS[kind]()).is_whole() is whole


def test_a_tensor_saved_in_the_other_byte_order_is_never_viewed_raw(monkeypatch):
    saved = torch.arange(4, dtype=torch.int32)  # saved here, read as by a host of the other order
    other = "big" if sys.byteorder == "little" else "little"
    monkeypatch.setattr(tensor_archive, "sys", types.SimpleNamespace(byteorder=other))
    layouts: dict = {}
    assert torch.equal(stored_tensor(_saved(saved), layouts), saved)  # torch.load swaps
    assert layouts == {}  # so no later archive is viewed (or read into place) unswapped
