"""A copy of the training state in host memory, so a checkpoint can be written in the background.

Training may change the weights the moment the loop moves on, so an asynchronous save first
copies every tensor of the state (`Snapshot.take`); only that copy blocks the loop. The host
buffers are kept and refilled at the next save (which first waits for the previous write): a
fresh allocation would fault in every page again and cost several times the copy itself. On
CUDA they are pinned, so the device-to-host copies run at full speed and all start at once;
they are carved out of a few chunks pinned at the state's own size (`hpcddp.storage.chunks`),
not one power-of-two block per tensor. Tensors that share memory (tied weights) share one
buffer, as ``torch.save`` would store them.
"""

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from hpcddp.storage import chunks

_Key = tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype]


class Snapshot:
    """Reusable host buffers for copies of a nested state (dicts, lists, tuples, tensors)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._chunks: list[Any] = []  # kept for the snapshot's life: buffers view them
        self.nbytes = 0  # the state's bytes
        self.pinned_bytes = 0  # host memory pinned for it
        self._from_cuda = False

    def prepare(self, state: Any) -> None:
        """Allocate (and touch) the buffers ``state`` will need, without copying it.

        Meant for a helper thread early in a run, so the first `take` finds its buffers
        ready instead of faulting in a whole state's worth of fresh pages while training
        waits. Reads only the tensors' shapes, types and identities.
        """
        for buffer in self._ensure(state):
            buffer.fill_(0)  # touch every page now

    def take(self, state: Any) -> Any:
        """A copy of ``state`` whose tensors live in this snapshot's host buffers."""
        self._ensure(state)
        shared: dict[_Key, torch.Tensor] = {}
        self._from_cuda = False
        copied = self._copy(state, (), shared)
        if self._from_cuda:
            torch.cuda.current_stream().synchronize()  # the copies were queued non-blocking
        return copied

    def _ensure(self, state: Any) -> list[torch.Tensor]:
        """Buffers for the tensors that have none of their shape yet, all planned together."""
        missing = [(path, t) for path, t in _tensors(state) if not self._fits(path, t)]
        if not missing:
            return []
        pin = any(t.is_cuda for _, t in missing)
        layout = chunks.plan([t.numel() * t.element_size() for _, t in missing])
        device = next((t.device for _, t in missing if t.is_cuda), None)  # the state's GPU
        made = [chunks.allocate(size, pin, device) for size in layout.chunks]
        self._chunks += [chunk for chunk, _ in made]
        self.pinned_bytes += sum(len(chunk) for chunk, pinned in made if pinned)
        for (path, tensor), (chunk, offset) in zip(missing, layout.places, strict=True):
            self._buffers[path] = chunks.carve(made[chunk][0], offset, tensor)
        self.nbytes = sum(b.nbytes for b in self._buffers.values())
        return [self._buffers[path] for path, _ in missing]

    def _fits(self, path: tuple, src: torch.Tensor) -> bool:
        buffer = self._buffers.get(path)
        return buffer is not None and buffer.shape == src.shape and buffer.dtype == src.dtype

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
        buffer = self._buffers[path]
        buffer.copy_(src.detach(), non_blocking=src.is_cuda)
        self._from_cuda |= src.is_cuda
        shared[key] = buffer
        return buffer


def _tensors(obj: Any, path: tuple = (), seen: set | None = None) -> Iterator[tuple]:
    """(path, tensor) for each distinct tensor of a nested state, in order (ties once)."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        if _identity(obj) not in seen:
            seen.add(_identity(obj))
            yield path, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _tensors(value, (*path, key), seen)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _tensors(value, (*path, i), seen)


def _identity(t: torch.Tensor) -> _Key:
    """Equal for two tensors that view the very same elements."""
    return (
        t.untyped_storage().data_ptr(),
        int(t.storage_offset()),
        tuple(t.shape),
        tuple(t.stride()),
        t.dtype,
    )
