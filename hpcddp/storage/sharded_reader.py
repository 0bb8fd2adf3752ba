"""DCP's file reader, reading each shard file once, front to back, and checking its digest on
the way.

torch's ``FileSystemReader`` seeks to each item it needs and reads it through a buffered file
view; verifying the files' digests besides would read every file a second time. This reader
takes the items a rank needs from a file in file order, in one sequential read. Each file any
rank reads from is checked by one rank, the one that reads most of it (chosen on the
coordinator from every rank's plan): that rank feeds XXH3 (`hpcddp.storage.digest`) with
every byte of it, those between its items included, and checks the file's digest against the
marker's (`hpcddp.storage.sharded`) at its end; the others seek to their items. A mismatch
raises `CheckpointError` naming the file (DCP then fails the load on every rank, and resume
falls back to an older checkpoint; what was already copied into the model is overwritten by
that one). Each item is deserialised
from its bytes in memory (DCP writes each tensor as a small ``torch.save`` archive), its
layout unpickled once for all the items that share it (`stored_tensor`).
"""

import dataclasses
import io
import os
import pathlib
import pickle
import struct
import warnings
from typing import Any

import torch
import xxhash
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.futures import Future

from hpcddp.errors import CheckpointError
from hpcddp.storage import digest
from hpcddp.storage.sharded import mismatch

_SKIP_BYTES = 8 << 20  # one scratch buffer for the bytes between a rank's items


class VerifyingReader(FileSystemReader):
    """A ``FileSystemReader`` that reads each file once, sequentially, checking ``digests``
    (``{file name: xxh3-128 token}``, the marker's); None reads without checking."""

    def __init__(self, path: str | os.PathLike[str], digests: dict[str, str] | None) -> None:
        super().__init__(path)
        self.digests = digests
        self.layouts: dict[bytes, Layout] = {}  # of this load's items (`stored_tensor`)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The ``.metadata`` in one read, checked against its digest, then unpickled (torch's
        reader unpickles it straight from the file, 8 KB at a time)."""
        if kwargs.get("rank") is not None:  # per-rank metadata: not what hpcddp writes
            return super().read_metadata(*args, **kwargs)
        path = pathlib.Path(self.path) / ".metadata"
        data = path.read_bytes()
        expected = (self.digests or {}).get(path.name)
        if self.digests is not None:
            actual = f"{digest.XXH3}:{xxhash.xxh3_128_hexdigest(data)}"
            if actual != expected:
                raise CheckpointError(mismatch(path, expected or "(none)", actual))
        metadata = pickle.loads(data)  # as torch's reader does: DCP's own format
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """On the coordinator, with every rank's plan: each file touched is checked by one rank,
        the one that reads most of it (a rank that needs a few small items of another's file
        seeks to them instead of reading the whole file)."""
        read: dict[str, list[int]] = {}  # file: bytes each rank reads of it
        for rank, plan in enumerate(plans):
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                read.setdefault(info.relative_path, [0] * len(plans))[rank] += info.length
        checks: list[set[str]] = [set() for _ in plans]
        for name, by_rank in read.items():
            checks[by_rank.index(max(by_rank))].add(name)
        return [dataclasses.replace(p, storage_data=c) for p, c in zip(plans, checks, strict=True)]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(
                item
            )
        checks = plan.storage_data if isinstance(plan.storage_data, set) else set(per_file)
        for name, items in per_file.items():
            self._read_file(pathlib.Path(self.path) / name, items, planner, name in checks)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_file(
        self, path: pathlib.Path, items: list[Any], planner: LoadPlanner, check: bool
    ) -> None:
        """Every item of ``items`` from ``path``, in file order, in one pass that hashes it when
        this rank ``check``s the file."""
        expected = (self.digests or {}).get(path.name)
        if self.digests is not None and expected is None:
            raise CheckpointError(f"sharded checkpoint {path.parent}: no digest for {path.name}")
        hasher = xxhash.xxh3_128() if expected is not None and check else None
        items = sorted(items, key=lambda i: self.storage_data[i.storage_index].offset)
        scratch = memoryview(bytearray(_SKIP_BYTES))
        position, last = 0, (-1, b"")
        with open(path, "rb") as handle:  # buffered: read(n) returns n bytes
            for item in items:
                info = self.storage_data[item.storage_index]
                if getattr(info, "transform_descriptors", None):
                    raise CheckpointError(f"{path}: compressed or transformed items unsupported")
                if info.offset != last[0]:  # two items may read one stored chunk
                    position += _skip(handle, hasher, scratch, info.offset - position)
                    last = (info.offset, _read(handle, hasher, info.length, path))
                    position += info.length
                _deliver(item, last[1], planner, self.layouts)
            if hasher is not None:
                _skip(handle, hasher, scratch, None)
        if hasher is not None and f"{digest.XXH3}:{hasher.hexdigest()}" != expected:
            assert expected is not None
            raise CheckpointError(mismatch(path, expected, f"{digest.XXH3}:{hasher.hexdigest()}"))


def _skip(handle: Any, hasher: Any, scratch: memoryview, count: int | None) -> int:
    """Read past ``count`` bytes (None: to the end), hashing them when verifying."""
    if count is not None and count < 0:
        raise CheckpointError("overlapping items in a shard file: not written by DCP")
    if hasher is None and count is not None:
        if count:  # a seek drops the read buffer: only past a gap
            handle.seek(count, io.SEEK_CUR)
        return count
    total = 0
    while count is None or total < count:
        want = len(scratch) if count is None else min(len(scratch), count - total)
        n = handle.readinto(scratch[:want])
        if not n:
            break
        hasher.update(scratch[:n])
        total += n
    return total


def _read(handle: Any, hasher: Any, length: int, path: pathlib.Path) -> bytes:
    """Exactly ``length`` bytes (a short file is a truncated one), hashed when verifying: one
    copy from the kernel, shared (not copied) by the ``BytesIO`` that deserialises it."""
    data = handle.read(length)
    if len(data) < length:
        raise CheckpointError(f"sharded checkpoint {path.parent}: {path.name} is truncated")
    if hasher is not None:
        hasher.update(data)
    return data


def _deliver(item: Any, data: bytes, planner: LoadPlanner, layouts: dict) -> None:
    """One read item, from its stored bytes, into the state dict DCP is loading."""
    if item.type == LoadItemType.BYTE_IO:
        planner.load_bytes(item, io.BytesIO(data))
        return
    stored = stored_tensor(data, layouts)
    for dim, (offset, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
        stored = stored.narrow(dim, offset, length)
    target = planner.resolve_tensor(item).detach()
    if target.size() != stored.size():
        raise CheckpointError(
            f"stored {item.storage_index.fqn} is {tuple(stored.size())}, the model's "
            f"{tuple(target.size())}: a checkpoint of another model"
        )
    target.copy_(stored)
    planner.commit_tensor(item, target)


def stored_tensor(data: bytes, layouts: dict[bytes, "Layout"]) -> torch.Tensor:
    """The tensor an item's bytes hold (a ``torch.save`` archive of one tensor), a view of
    ``data`` where it can be.

    ``torch.load`` takes about 0.5 ms an item (its safe unpickler; a view: 0.012 ms), and a
    few item layouts (dtype, shape, strides) repeat across a model's blocks. So each distinct
    pickle is unpickled once, by ``torch.load(weights_only=True)``, and its layout kept: the
    same pickle bytes describe the same layout, so a later item with them is its storage
    record, viewed in place (one copy, into the model, after). ``layouts`` keeps them (one
    load's). Anything unexpected in the archive: ``torch.load``, as DCP itself does.
    """
    found = _archive(data)
    layout = layouts.get(found[0]) if found else None
    if found is None or layout is None or found[2] != layout.nbytes:
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if found is not None:
            layouts[found[0]] = Layout.of(tensor)
        return tensor
    with warnings.catch_warnings():  # read-only bytes: only read, then copied into the model
        warnings.simplefilter("ignore", UserWarning)
        storage = torch.frombuffer(data, dtype=torch.uint8, count=found[2], offset=found[1])
    return storage.view(layout.dtype).as_strided(layout.size, layout.stride, layout.offset)


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a stored tensor lies in its storage record."""

    dtype: torch.dtype
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    nbytes: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "Layout":
        nbytes = tensor.untyped_storage().nbytes()
        offset, size = int(tensor.storage_offset()), tuple(int(n) for n in tensor.shape)
        return cls(tensor.dtype, offset, size, tuple(tensor.stride()), nbytes)


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


__all__ = ["Layout", "VerifyingReader", "stored_tensor"]
