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
that one). A tensor whose layout the load has seen is read straight into the model's tensor
when it fits it exactly; any other item is taken from its bytes in memory
(`hpcddp.storage.tensor_archive`).
"""

import collections
import dataclasses
import io
import logging
import os
import pathlib
import pickle
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
from hpcddp.storage.tensor_archive import HEAD, Layout, known_layout, stored_tensor

log = logging.getLogger(__name__)


class VerifyingReader(FileSystemReader):
    """A ``FileSystemReader`` that reads each file once, sequentially, checking ``digests``
    (``{file name: xxh3-128 token}``, the marker's); None reads without checking."""

    def __init__(self, path: str | os.PathLike[str], digests: dict[str, str] | None) -> None:
        super().__init__(path)
        self.digests = digests
        self.layouts: dict[bytes, Layout] = {}  # of this load's items (`stored_tensor`)
        self.placed = 0  # items read straight into the model's tensors

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
        log.debug("%d of %d items read straight into place", self.placed, len(plan.items))
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
        readers = collections.Counter(self.storage_data[i.storage_index].offset for i in items)
        position = 0
        last: tuple[int, bytes | None] = (-1, b"")
        with open(path, "rb") as handle:  # buffered: read(n) returns n bytes
            shard = _ShardFile(handle, path, hasher)
            for item in items:
                info = self.storage_data[item.storage_index]
                if getattr(info, "transform_descriptors", None):
                    raise CheckpointError(f"{path}: compressed or transformed items unsupported")
                if info.offset != last[0]:  # two items may read one stored chunk
                    position += shard.skip(info.offset - position)
                    alone = readers[info.offset] == 1
                    last = (info.offset, self._item(shard, item, info, planner, alone))
                    position += info.length
                if (data := last[1]) is not None:  # else read into place
                    _deliver(item, data, planner, self.layouts)
            if hasher is None:
                return
            shard.skip(None)
        actual = f"{digest.XXH3}:{hasher.hexdigest()}"
        if actual != expected:
            assert expected is not None
            raise CheckpointError(mismatch(path, expected, actual))

    def _item(
        self, shard: "_ShardFile", item: Any, info: Any, planner: LoadPlanner, alone: bool
    ) -> bytes | None:
        """A stored item's bytes, hashed when verifying; None when its tensor was read straight
        into the model's: an item only this read item needs, whole, of a layout seen before
        (`tensor_archive.known_layout`), into a tensor it fits exactly: one copy of its bytes,
        as a raw read makes, instead of a new buffer faulted in and a copy out of it."""
        if not alone or item.type == LoadItemType.BYTE_IO or info.length <= HEAD:
            return shard.read(info.length)
        first = shard.read(HEAD)
        layout = known_layout(first, self.layouts)
        target = self._place_for(layout, item, info, planner)
        if layout is None or target is None:
            return first + shard.read(info.length - HEAD)
        start = len(layout.prefix)
        place = target.view(-1).view(torch.uint8).numpy().data
        early = HEAD - start  # the tensor's first bytes, read with the prefix
        place[:early] = first[start:]
        shard.read_into(place[early:])
        shard.read(info.length - start - layout.nbytes)
        planner.commit_tensor(item, target)
        self.placed += 1
        return None

    def _place_for(self, layout: Layout | None, item: Any, info: Any, planner: LoadPlanner) -> Any:
        """The model's tensor ``item`` loads, when the stored one (of ``layout``) fits it byte
        for byte and its bytes go on past the first `HEAD` read."""
        if layout is None or not layout.is_whole():
            return None
        end = len(layout.prefix) + layout.nbytes
        if not HEAD <= end <= info.length:
            return None
        if any(item.storage_offsets) or tuple(item.lengths) != layout.size:
            return None
        target = planner.resolve_tensor(item).detach()
        fits = target.device.type == "cpu" and target.is_contiguous() and target.numel() > 0
        if not fits or target.dtype != layout.dtype or tuple(target.shape) != layout.size:
            return None
        return target


@dataclasses.dataclass
class _ShardFile:
    """One shard file being read front to back: every byte read goes through ``hasher`` when
    this rank verifies the file (None: it does not)."""

    handle: Any
    path: pathlib.Path
    hasher: Any
    scratch: memoryview = dataclasses.field(  # for the bytes between a rank's items
        default_factory=lambda: memoryview(bytearray(digest.READ_BYTES))
    )

    def read(self, length: int) -> bytes:
        """Exactly ``length`` bytes: one copy from the kernel, shared (not copied) by the
        ``BytesIO`` that deserialises it."""
        data = self.handle.read(length)
        if len(data) < length:
            raise self._truncated()
        if self.hasher is not None:
            self.hasher.update(data)
        return data

    def read_into(self, place: memoryview) -> None:
        """Fill ``place`` with the next bytes of the file."""
        if self.handle.readinto(place) != len(place):
            raise self._truncated()
        if self.hasher is not None:
            self.hasher.update(place)

    def skip(self, count: int | None) -> int:
        """Read past ``count`` bytes (None: to the end), hashing them when verifying."""
        if count is not None and count < 0:
            raise CheckpointError("overlapping items in a shard file: not written by DCP")
        if self.hasher is None and count is not None:
            if count:  # a seek drops the read buffer: only past a gap
                self.handle.seek(count, io.SEEK_CUR)
            return count
        return digest.read_hashing(self.handle, self.hasher, self.scratch, count, reuse=True)

    def _truncated(self) -> CheckpointError:
        return CheckpointError(
            f"sharded checkpoint {self.path.parent}: {self.path.name} is truncated"
        )


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


__all__ = ["VerifyingReader"]
