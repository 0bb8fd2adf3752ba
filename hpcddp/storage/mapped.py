"""Checkpoints read through a memory map: no copy of the file in memory, pages let go as used.

``torch.load(mmap=True, weights_only=True)`` maps the file privately and gives tensors that
view the mapped pages: nothing is read until touched, and the bytes come from the page cache,
which every rank on a node shares. As each loaded tensor is copied to where it belongs (a
parameter, a fresh optimizer buffer), `release` drops its pages from this process
(``madvise(MADV_DONTNEED)``; the page cache keeps them), so a resume holds the training state
plus about one tensor, not the state twice. The mapping is private and never written, so a
dropped page would only be read again from the unchanged file.
"""

import ctypes
import mmap
import os
from collections.abc import Collection, Mapping
from typing import Any

import torch

_PAGE = mmap.PAGESIZE
_CHUNK_BYTES = 16 << 20  # a big tensor is copied and released this much at a time
_MADV_DONTNEED = 4  # Linux
_MADV_POPULATE_READ = 22  # Linux >= 5.14; older kernels refuse it (EINVAL) and fault as before
# the interpreter's own symbols, libc's among them: find_library("c") would run ldconfig
# in a subprocess on every rank at import
_libc = ctypes.CDLL(None, use_errno=True)
_madvise = getattr(_libc, "madvise", None)


def load(path: str | os.PathLike) -> Any:
    """The object in ``path``, tensors mapped (safe unpickling only: ``weights_only``)."""
    return torch.load(os.fspath(path), map_location="cpu", mmap=True, weights_only=True)


def release(tensor: torch.Tensor) -> None:
    """Let go of the whole pages under ``tensor`` (for mapped tensors already copied)."""
    _advise(tensor, _MADV_DONTNEED, whole_pages_only=True)


def populate(tensor: torch.Tensor) -> None:
    """Map every page under ``tensor`` in one call before it is read: a 1 GB state is 270,000
    pages, each otherwise one page fault of its own (a resume's copy ran 1.3x a raw read)."""
    _advise(tensor, _MADV_POPULATE_READ, whole_pages_only=False)


def _advise(tensor: torch.Tensor, advice: int, whole_pages_only: bool) -> None:
    """``madvise(advice)`` on the pages under ``tensor``: only those wholly inside it, or
    every page it touches."""
    if _madvise is None or tensor.device.type != "cpu" or os.uname().sysname != "Linux":
        return
    if tensor.is_contiguous():
        start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.nbytes
    else:
        start = tensor.untyped_storage().data_ptr()
        end = start + tensor.untyped_storage().nbytes()
    if whole_pages_only:
        first, last = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    else:
        first, last = start // _PAGE * _PAGE, -(-end // _PAGE) * _PAGE
    if last > first:
        _madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), advice)


def materialize(obj: Any) -> Any:
    """``obj`` with every tensor copied into fresh memory, each mapped source released."""
    if isinstance(obj, torch.Tensor):
        fresh = torch.empty_like(obj, memory_format=torch.contiguous_format)
        copy_released(fresh, obj)
        return fresh
    if isinstance(obj, Mapping):
        return {k: materialize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(materialize(v) for v in obj)
    return obj


def copy_into(
    destination: dict[str, torch.Tensor], loaded: Mapping[str, Any], done: Collection[str] = ()
) -> bool:
    """Copy ``loaded`` into ``destination`` (a module's ``state_dict()``), releasing as it goes;
    the keys in ``done`` are already in place (`hpcddp.storage.into_place`).

    Returns False, copying nothing, when keys or shapes differ: the caller then lets
    ``load_state_dict`` say exactly what does not fit.
    """
    if not fits(destination, loaded):
        return False
    with torch.no_grad():
        for key, target in destination.items():
            if key not in done:
                copy_released(target, loaded[key])
    return True


def fits(destination: dict[str, torch.Tensor], loaded: Mapping[str, Any]) -> bool:
    """Whether ``loaded`` has a tensor of the same shape for each key of ``destination``, and
    nothing else."""
    return destination.keys() == loaded.keys() and all(
        isinstance(loaded[k], torch.Tensor) and loaded[k].shape == v.shape
        for k, v in destination.items()
    )


def copy_released(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target.copy_(source)``, a chunk at a time for big tensors, releasing each chunk of
    ``source`` once copied: a single 1 GB tensor must not be resident twice either."""
    if not (target.is_contiguous() and source.is_contiguous()) or source.nbytes <= _CHUNK_BYTES:
        populate(source)
        target.copy_(source)
        release(source)
        return
    flat_target, flat_source = target.view(-1), source.view(-1)
    step = max(_CHUNK_BYTES // source.element_size(), 1)
    for start in range(0, flat_source.numel(), step):
        piece = flat_source[start : start + step]
        populate(piece)
        flat_target[start : start + step].copy_(piece)
        release(piece)
