"""One stored tensor from its bytes: DCP writes each tensor as a small ``torch.save`` archive.

``torch.load`` takes about 0.5 ms an item (its safe unpickler; a view: 0.012 ms), and a few
item layouts (dtype, shape, strides) repeat across a model's blocks. So each distinct pickle is
unpickled once, by ``torch.load(weights_only=True)``, and its layout kept: the same pickle bytes
describe the same layout, so a later item with them is its storage record, viewed in place (one
copy, into the model, after); and an archive that begins with the bytes that preceded the
tensor's in one of that layout (`known_layout`) has its tensor's bytes right after them: a
reader can then read those straight into the model.
"""

import dataclasses
import io
import math
import struct
import sys
import warnings

import torch

HEAD = 4096  # an item's first bytes read alone: its pickle and headers, before the tensor's


def stored_tensor(data: bytes, layouts: dict[bytes, "Layout"]) -> torch.Tensor:
    """The tensor an item's bytes hold (a ``torch.save`` archive of one tensor), a view of
    ``data`` where its layout is in ``layouts`` (one load's, filled here). Anything unexpected
    in the archive: ``torch.load``, as DCP itself does."""
    found = _archive(data)
    layout = layouts.get(found[0]) if found else None
    if found is None or layout is None or found[2] != layout.nbytes:
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if found is not None and found[0].endswith(sys.byteorder.encode()):  # else swapped
            layouts[found[0]] = Layout.of(tensor, bytes(data[: found[1]]))
        return tensor
    with warnings.catch_warnings():  # read-only bytes: only read, then copied into the model
        warnings.simplefilter("ignore", UserWarning)
        storage = torch.frombuffer(data, dtype=torch.uint8, count=found[2], offset=found[1])
    return storage.view(layout.dtype).as_strided(layout.size, layout.stride, layout.offset)


def known_layout(first: bytes, layouts: dict[bytes, "Layout"]) -> "Layout | None":
    """The layout of the archive whose first bytes are ``first``: one seen before whose
    prefix (`Layout.prefix`) they begin with; None if none."""
    for layout in layouts.values():
        if layout.prefix and first.startswith(layout.prefix):
            return layout
    return None


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a stored tensor lies in its storage record."""

    dtype: torch.dtype
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    nbytes: int
    # the archive's bytes before the tensor's: its headers and the whole pickle, so the same in
    # every archive of this layout (torch writes no time in them; checksums and sizes follow
    # the data): an archive that begins with them has the tensor's bytes right after them
    prefix: bytes = b""

    def is_whole(self) -> bool:
        """Whether the tensor is its storage, front to back (row-major, nothing around it)."""
        row_major = [math.prod(self.size[d + 1 :]) for d in range(len(self.size))]
        strides = zip(self.size, self.stride, row_major, strict=True)
        return (
            self.offset == 0
            and math.prod(self.size) * self.dtype.itemsize == self.nbytes
            and all(n == 1 or s == r for n, s, r in strides)
        )

    @classmethod
    def of(cls, tensor: torch.Tensor, prefix: bytes = b"") -> "Layout":
        nbytes = tensor.untyped_storage().nbytes()
        offset, size = int(tensor.storage_offset()), tuple(int(n) for n in tensor.shape)
        return cls(tensor.dtype, offset, size, tuple(tensor.stride()), nbytes, prefix)


def _archive(data: bytes) -> tuple[bytes, int, int] | None:
    """(pickle + byte order, start, length of the one storage record) of a ``torch.save``
    archive of a single tensor stored uncompressed, read from its zip central directory;
    None for anything else (zip64, compression, several storages, no byte order)."""
    end = len(data) - 22  # the end-of-directory record, torch writes no comment
    if end < 0 or data[end : end + 4] != b"PK\x05\x06":
        return None
    count, _, where = struct.unpack_from("<HII", data, end + 10)
    records = {}
    for _ in range(count):
        if data[where : where + 4] != b"PK\x01\x02":
            return None
        method, size, stored, names, extra, comment = struct.unpack_from(
            "<H8xIIHHH", data, where + 10
        )
        header = struct.unpack_from("<I", data, where + 42)[0]
        name = data[where + 46 : where + 46 + names].partition(b"/")[2]
        if method != 0 or size != stored or 0xFFFFFFFF in (size, header):
            return None
        records[name] = (header, size)
        where += 46 + names + extra + comment
    if [n for n in records if n.startswith(b"data/")] != [b"data/0"] or b"byteorder" not in records:
        return None
    pickle, order = (_record(data, *records[n]) for n in (b"data.pkl", b"byteorder"))
    start = _record_start(data, records[b"data/0"][0])
    if pickle is None or order is None or start is None:
        return None
    return pickle + order, start, records[b"data/0"][1]


def _record_start(data: bytes, header: int) -> int | None:
    """Where a record's bytes begin, after its local header."""
    if data[header : header + 4] != b"PK\x03\x04":
        return None
    names, extra = struct.unpack_from("<HH", data, header + 26)
    return header + 30 + names + extra


def _record(data: bytes, header: int, size: int) -> bytes | None:
    start = _record_start(data, header)
    return None if start is None else data[start : start + size]


__all__ = ["HEAD", "Layout", "known_layout", "stored_tensor"]
