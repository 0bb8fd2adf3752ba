"""Pinned host memory at the size of the state (issue 15 item 7), without a GPU.

`FakeHostMemory` stands in for CUDA's two ways to pin: ``torch.empty(pin_memory=True)``, whose
caching host allocator rounds every block up to a power of two, and ``cudaHostRegister``, which
pins exactly the bytes it is given. It counts what each would pin, so the tests hold for any
implementation of the snapshot.
"""

import itertools

import torch

from hpcddp.storage import chunks
from hpcddp.storage.snapshot import Snapshot

# A state whose tensors round up badly: each just over a power of two, and one big tensor.
BAD_SIZES = [(1 << 20) + 4] * 6 + [(3 << 20) + 8, 12, 8, 0]


class FakeHostMemory:
    """Records pinned bytes; makes every tensor look like a GPU tensor when ``all_cuda``."""

    def __init__(self, monkeypatch, all_cuda: bool = False) -> None:
        self.registered: list[int] = []  # cudaHostRegister: exact bytes
        self.rounded: list[int] = []  # the caching host allocator: 2^k bytes per block
        self.synced = 0
        real_empty = torch.empty
        memory = self

        def empty(*args, pin_memory=False, **kwargs):
            made = real_empty(*args, **kwargs)
            if pin_memory:
                memory.rounded.append(chunks.power_of_two_bytes([made.nbytes]))
            return made

        class CudaRuntime:
            def cudaHostRegister(self, pointer, nbytes, flags):
                memory.registered.append(nbytes)
                return 0

            def cudaHostUnregister(self, pointer):
                return 0

        class Stream:
            def synchronize(self):
                memory.synced += 1

        monkeypatch.setattr(torch, "empty", empty)
        monkeypatch.setattr(torch.cuda, "cudart", CudaRuntime)
        monkeypatch.setattr(torch.cuda, "current_stream", Stream)
        if all_cuda:
            monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))

    @property
    def pinned(self) -> int:
        return sum(self.registered) + sum(self.rounded)


def test_the_plan_packs_buffers_aligned_without_overlap_into_bounded_chunks():
    sizes = [*BAD_SIZES, 300 << 20]  # the last one is larger than a chunk: alone
    layout = chunks.plan(sizes)
    assert layout.chunks[-1] == chunks.aligned(300 << 20) and layout.places[-1][1] == 0
    assert all(size <= chunks.CHUNK_BYTES for size in layout.chunks[:-1])
    spans = sorted(
        (chunk, offset, offset + size)
        for size, (chunk, offset) in zip(sizes, layout.places, strict=True)
    )
    for (c1, _, end), (c2, start, _) in itertools.pairwise(spans):
        assert c1 != c2 or end <= start  # no two buffers share a byte
    assert all(offset % chunks.ALIGN == 0 for _, offset in layout.places)
    assert sum(layout.chunks) <= 1.1 * sum(sizes)


def test_a_small_chunk_size_starts_new_chunks_and_keeps_the_total_tight():
    layout = chunks.plan([400, 400, 400, 2000], chunk_bytes=1024, align=8)
    assert layout.chunks == (800, 400, 2000)  # each chunk sized to what it holds
    assert layout.places == ((0, 0), (0, 400), (1, 0), (2, 0))


def test_a_snapshot_of_gpu_state_pins_about_its_own_size(monkeypatch):
    state = {f"t{i}": torch.zeros(size, dtype=torch.uint8) for i, size in enumerate(BAD_SIZES)}
    state["opt"] = {"step": torch.tensor(3.0), "m": torch.randn(1000, 257)}
    state_bytes = sum(BAD_SIZES) + 4 + 1000 * 257 * 4
    assert chunks.power_of_two_bytes([*BAD_SIZES, 4, 1000 * 257 * 4]) > 1.5 * state_bytes
    memory = FakeHostMemory(monkeypatch, all_cuda=True)
    snapshot = Snapshot()
    copy = snapshot.take(state)
    print(f"pinned / state: {memory.pinned / state_bytes:.3f}")
    assert state_bytes <= memory.pinned <= 1.1 * state_bytes
    assert torch.equal(copy["opt"]["m"], state["opt"]["m"]) and copy["opt"]["step"].item() == 3.0
    state["opt"]["m"].add_(1)
    again = snapshot.take(state)  # refilled: nothing more pinned
    assert torch.equal(again["opt"]["m"], state["opt"]["m"]) and memory.pinned <= 1.1 * state_bytes


class OnCuda1(torch.Tensor):
    """A host tensor that reports itself on cuda:1, as a rank's state on its GPU does."""

    is_cuda = True

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 1)


def test_a_helper_thread_pins_for_the_state_s_gpu_and_every_context(monkeypatch):
    """`Snapshot.prepare` runs on a helper thread whose current device is CUDA's default (0):
    it must make the state's GPU its own before registering, and register portable memory."""
    import threading

    memory = FakeHostMemory(monkeypatch)
    flags, current = [], {}  # the registrations' flags; each thread's current device

    class Runtime:
        def cudaHostRegister(self, pointer, nbytes, flag):
            flags.append((flag, current.get(threading.get_ident())))
            return 0

        def cudaHostUnregister(self, pointer):
            return 0

    monkeypatch.setattr(torch.cuda, "cudart", Runtime)
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda d: current.__setitem__(threading.get_ident(), d)
    )
    state = {"w": torch.Tensor._make_subclass(OnCuda1, torch.zeros(1000))}
    helper = threading.Thread(target=Snapshot().prepare, args=(state,))
    helper.start()
    helper.join()
    assert flags == [(chunks.HOST_REGISTER_PORTABLE, torch.device("cuda", 1))], memory.registered
    assert threading.get_ident() not in current  # the training thread's device is left alone
