"""A resume's one pass over a checkpoint: each weight's bytes read from the file straight into
the parameter it restores, the file's digest computed on the way.

Why: verifying the digest (a read of the whole file) and copying the mapped weights into the
model (a second pass over the same pages, one more copy of every byte) made a resume 1.24-1.47x
a raw read of the file. Read into place, each byte is copied once, as in a raw read, and
XXH3 hashes it from where it landed (`hpcddp.storage.digest`, 20 GB/s against the disk's 2).

The places come from the mapped load (`hpcddp.storage.mapped`): unpickling maps the file and
reads only its small pickle, and a mapped tensor's address, against the mapping of the file in
``/proc/self/maps``, is its offset in the file. A weight is read in place only when it fits
exactly (same dtype, shape, contiguous on the CPU) and shares no bytes with one already placed
(a tied weight); the rest are copied from the mapping afterwards, from the page cache.
"""

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class Piece:
    """``buffer`` (a parameter's memory, as bytes) holds the file's bytes from ``offset`` on."""

    key: str
    offset: int
    buffer: memoryview


def pieces(
    path: str | os.PathLike, destination: dict[str, torch.Tensor], loaded: Mapping[str, Any]
) -> list[Piece]:
    """The weights of ``loaded`` (mapped from ``path``) that can be read straight into
    ``destination`` (a module's ``state_dict()``), in file order."""
    pairs = [
        (key, target, loaded[key])
        for key, target in destination.items()
        if isinstance(loaded.get(key), torch.Tensor) and _fits(target, loaded[key])
    ]
    offsets = file_offsets(path, [source for _, _, source in pairs])
    placed = [
        Piece(key, offset, target.detach().view(-1).view(torch.uint8).numpy().data)
        for (key, target, _), offset in zip(pairs, offsets, strict=True)
        if offset is not None
    ]
    placed.sort(key=lambda piece: piece.offset)
    return _without_overlaps(placed)


def _fits(target: torch.Tensor, source: torch.Tensor) -> bool:
    return (
        target.device.type == "cpu"
        and target.dtype == source.dtype
        and target.shape == source.shape
        and target.is_contiguous()
        and source.is_contiguous()
        and target.nbytes > 0
    )


def _without_overlaps(placed: list[Piece]) -> list[Piece]:
    """Pieces that share no byte of the file, the first of each overlapping run kept."""
    kept: list[Piece] = []
    end = -1
    for piece in placed:
        if piece.offset >= end:
            kept.append(piece)
            end = piece.offset + piece.buffer.nbytes
    return kept


def file_offsets(path: str | os.PathLike, tensors: list[torch.Tensor]) -> list[int | None]:
    """Where in ``path`` each tensor's bytes lie, for tensors that view a mapping of it (None
    for the others): its address within the mapping, plus the mapping's offset in the file."""
    regions = _mappings_of(path)
    offsets: list[int | None] = []
    for tensor in tensors:
        start = tensor.data_ptr()
        region = next((r for r in regions if r[0] <= start < r[1]), None)
        if region is None or start + tensor.nbytes > region[1]:
            offsets.append(None)
        else:
            low, _, offset = region
            offsets.append(offset + start - low)
    return offsets


def _mappings_of(path: str | os.PathLike) -> list[tuple[int, int, int]]:
    """(start, end, offset in the file) of each mapping of ``path`` in this process."""
    try:
        inode, name = str(os.stat(path).st_ino), os.path.realpath(path)
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []  # not Linux, or the file is gone: every weight is copied from the mapping
    regions = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[4] == inode and fields[5] == name:
            low, high = (int(address, 16) for address in fields[0].split("-"))
            regions.append((low, high, int(fields[2], 16)))
    return regions
