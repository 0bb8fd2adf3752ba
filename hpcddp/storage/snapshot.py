"""A copy of the training state in host memory, so a checkpoint can be written in the background.

Training may change the weights the moment the loop moves on, so an asynchronous save first
copies every tensor of the state (`Snapshot.take`); only that copy blocks the loop. The host
buffers are kept and refilled at the next save (which first waits for the previous write): a
fresh allocation would fault in every page again and cost several times the copy itself. On
CUDA they are pinned, so the device-to-host copies run at full speed and all start at once.
Tensors that share memory (tied weights) share one buffer, as ``torch.save`` would store them.
"""

from collections.abc import Mapping
from typing import Any

import torch

_Key = tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype]


class Snapshot:
    """Reusable host buffers for copies of a nested state (dicts, lists, tuples, tensors)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self.nbytes = 0
        self._from_cuda = False

    def prepare(self, state: Any) -> None:
        """Allocate (and touch) the buffers ``state`` will need, without copying it.

        Meant for a helper thread early in a run, so the first `take` finds its buffers
        ready instead of faulting in a whole state's worth of fresh pages while training
        waits. Reads only the tensors' shapes, types and identities.
        """
        seen: set[_Key] = set()
        self._walk_prepare(state, (), seen)

    def _walk_prepare(self, obj: Any, path: tuple, seen: set[_Key]) -> None:
        if isinstance(obj, torch.Tensor):
            if _identity(obj) not in seen:
                seen.add(_identity(obj))
                self._buffer_for(obj, path).fill_(0)  # touch every page now
        elif isinstance(obj, Mapping):
            for key, value in obj.items():
                self._walk_prepare(value, (*path, key), seen)
        elif isinstance(obj, (list, tuple)):
            for i, value in enumerate(obj):
                self._walk_prepare(value, (*path, i), seen)

    def take(self, state: Any) -> Any:
        """A copy of ``state`` whose tensors live in this snapshot's host buffers."""
        shared: dict[_Key, torch.Tensor] = {}
        self._from_cuda = False
        copied = self._copy(state, (), shared)
        if self._from_cuda:
            torch.cuda.current_stream().synchronize()  # the copies were queued non-blocking
        return copied

    def _copy(self, obj: Any, path: tuple, shared: dict[_Key, torch.Tensor]) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path, shared)
        if isinstance(obj, Mapping):
            return {k: self._copy(v, (*path, k), shared) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._copy(v, (*path, i), shared) for i, v in enumerate(obj))
        return obj  # numbers, strings, None: immutable

    def _tensor(self, src: torch.Tensor, path: tuple, shared: dict[_Key, torch.Tensor]) -> Any:
        key = _identity(src)
        if key in shared:
            return shared[key]
        buffer = self._buffer_for(src, path)
        buffer.copy_(src.detach(), non_blocking=src.is_cuda)
        self._from_cuda |= src.is_cuda
        shared[key] = buffer
        return buffer

    def _buffer_for(self, src: torch.Tensor, path: tuple) -> torch.Tensor:
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != src.shape or buffer.dtype != src.dtype:
            buffer = torch.empty(src.shape, dtype=src.dtype, pin_memory=src.is_cuda)
            self._buffers[path] = buffer
            self.nbytes = sum(b.nbytes for b in self._buffers.values())
        return buffer


def _identity(t: torch.Tensor) -> _Key:
    """Equal for two tensors that view the very same elements."""
    return (
        t.untyped_storage().data_ptr(),
        int(t.storage_offset()),
        tuple(t.shape),
        tuple(t.stride()),
        t.dtype,
    )
