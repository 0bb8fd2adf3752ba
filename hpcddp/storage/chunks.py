"""Host memory for a snapshot in a few chunks, pinned at the size of the state.

``torch.empty(..., pin_memory=True)`` goes through CUDA's caching host allocator, which rounds
every block up to a power of two: one buffer per tensor pins up to twice the state (a 1.1 GB
tensor takes 2 GiB), and pinned memory counts against the job's ``--mem`` and is never swapped.
Here the tensors are packed into chunks of at most `CHUNK_BYTES` (a tensor larger than that
gets a chunk of its own), each chunk is an anonymous mapping sized to what it holds, pinned in
place (``cudaHostRegister``), so what is pinned is the state plus alignment. Each buffer is its
own storage over its part of a chunk (``torch.frombuffer``): ``torch.save`` writes it as one
tensor of its own, never as a view of a chunk shared with tensors of other types.
"""

import dataclasses
import logging
import mmap
import warnings
import weakref
from collections.abc import Sequence

import torch

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 << 20  # few registrations, and a little slack at most per chunk
ALIGN = 512  # every buffer starts here: any dtype's alignment, and DMA-friendly


@dataclasses.dataclass(frozen=True)
class Plan:
    """Where each buffer lives: ``places[i]`` is (chunk, byte offset) of the i-th size."""

    chunks: tuple[int, ...]  # each chunk's bytes
    places: tuple[tuple[int, int], ...]


def aligned(nbytes: int, align: int = ALIGN) -> int:
    """``nbytes`` rounded up to a multiple of ``align``."""
    return -(-nbytes // align) * align


def plan(sizes: Sequence[int], chunk_bytes: int = CHUNK_BYTES, align: int = ALIGN) -> Plan:
    """Pack buffers of ``sizes`` bytes, in order, into chunks of at most ``chunk_bytes``."""
    chunks: list[int] = []
    places: list[tuple[int, int]] = []
    open_chunk = -1  # the chunk small buffers are added to
    for size in sizes:
        need = aligned(size, align)
        if need > chunk_bytes:  # alone, at its own size
            chunks.append(need)
            places.append((len(chunks) - 1, 0))
            continue
        if open_chunk < 0 or chunks[open_chunk] + need > chunk_bytes:
            chunks.append(0)
            open_chunk = len(chunks) - 1
        places.append((open_chunk, chunks[open_chunk]))
        chunks[open_chunk] += need
    return Plan(tuple(chunks), tuple(places))


def power_of_two_bytes(sizes: Sequence[int]) -> int:
    """What one caching-allocator block per buffer would pin: each rounded up to 2^k."""
    return sum(1 << max(size - 1, 0).bit_length() for size in sizes if size)


def carve(chunk: mmap.mmap, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A buffer of ``like``'s shape and dtype at ``offset`` bytes into ``chunk``."""
    nbytes = like.numel() * like.element_size()
    if nbytes == 0:
        return torch.empty(like.shape, dtype=like.dtype)
    with warnings.catch_warnings():  # "non-writable buffer": an anonymous mapping is writable
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(chunk, dtype=torch.uint8, count=nbytes, offset=offset)
    return raw.view(like.dtype).view(like.shape)


# cudaHostRegisterPortable: pinned for every CUDA context, not only the calling thread's current
# one (a helper thread that never chose a device would otherwise pin it for device 0 alone).
HOST_REGISTER_PORTABLE = 1


def pin_in_place(chunk: mmap.mmap, device: torch.device | None = None) -> bool:
    """Page-lock ``chunk``'s memory, exactly its bytes, until the chunk is gone.

    Usually called on a helper thread (`hpcddp.storage.snapshot.Snapshot.prepare`), whose
    current device is CUDA's default, 0, until set: ``device`` (the state's GPU) is made its
    current one first, so no rank opens a context on GPU 0 from there, and the memory is
    registered as portable. Refused (a low ``ulimit -l``, say): the chunk stays pageable, the
    copies merely slower.
    """
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)  # this thread's own current device
    cudart = torch.cuda.cudart()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pointer = torch.frombuffer(chunk, dtype=torch.uint8).data_ptr()
    error = int(cudart.cudaHostRegister(pointer, len(chunk), HOST_REGISTER_PORTABLE))
    if error:
        log.warning(
            "could not pin %d bytes for checkpoint copies (CUDA error %d)", len(chunk), error
        )
        return False
    weakref.finalize(chunk, cudart.cudaHostUnregister, pointer)  # before it is unmapped
    return True


def allocate(nbytes: int, pin: bool, device: torch.device | None = None) -> tuple[mmap.mmap, bool]:
    """One chunk of host memory (page-aligned), and whether it was pinned (asked: GPU state,
    on ``device``)."""
    chunk = mmap.mmap(-1, max(nbytes, 1))
    return chunk, bool(pin and nbytes and pin_in_place(chunk, device))
