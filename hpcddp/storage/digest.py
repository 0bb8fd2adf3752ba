"""Checkpoint digests: XXH3-128 of the payload, at disk speed; older sha256 digests still verify.

Why XXH3-128: the digest guards against truncated, torn or bit-flipped files, not against an
attacker (whoever can rewrite a checkpoint can rewrite its sidecar too), so a 128-bit
non-cryptographic hash is enough, and it is an order of magnitude faster than sha256. Measured
on this machine's cores over 1 GiB in memory: sha256 1.7 GB/s, BLAKE3 (``blake3``, 1-2 threads)
4.2-5.0 GB/s, XXH3-128 (``xxhash``) 20.7 GB/s on one thread. With sha256, even chunked over two
threads, saving and loading a 1.1 GB checkpoint waited for the hash (save 0.69x a raw write,
load 2.58x a raw read); with XXH3 the disk is the limit. Why a library and not our own code:
xxHash's C implementation picks SSE2/AVX2/NEON at run time, is fuzzed and used by zstd and
rsync, and ``xxhsum`` (the ``xxhash`` package of every distribution) recomputes the same digest::

    xxhsum -H2 step-00000123.pt      # prints the hex after "xxh3-128:" in the sidecar

Tokens in a sidecar name their scheme (`SCHEMES`):

- ``xxh3-128:<32 hex>``: XXH3-128 of the whole file, what `stream_to_temp` writes now;
- ``sha256-16MiB-chunks:<64 hex>``: the sha256 of the text made of each 16 MiB chunk's hex
  sha256 and a newline, in file order, as the previous version wrote
  (``split -b 16M --filter='sha256sum | cut -c1-64' FILE | sha256sum``);
- ``<64 hex>`` with no prefix: ``sha256sum`` of the whole file, as the first versions wrote.
"""

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import xxhash

from hpcddp.storage import atomic

if TYPE_CHECKING:  # the pieces come from a mapped load; this module needs no torch
    from hpcddp.storage.into_place import Piece

XXH3 = "xxh3-128"
SHA256_CHUNKS = "sha256-16MiB-chunks"
SHA256 = "sha256"  # a bare hex token: no prefix in the sidecar
WRITTEN = XXH3
SCHEMES = {XXH3: 32, SHA256_CHUNKS: 64, SHA256: 64}  # scheme: hex digits of its digest
CHUNK_BYTES = 16 << 20
READ_BYTES = 8 << 20  # one buffer, refilled: verifying holds no copy of the file
_THREADS = 2


def scheme_of(token: str) -> str:
    """The scheme a sidecar token was written with; ValueError when it is not one we know."""
    scheme, _, hexdigits = token.rpartition(":")
    scheme = scheme or SHA256
    named = scheme in SCHEMES and (scheme != SHA256 or hexdigits == token)  # sha256: is bare
    if not named or not re.fullmatch(f"[0-9a-f]{{{SCHEMES[scheme]}}}", hexdigits):
        known = ", ".join(f"{s}:<{n} hex>" for s, n in SCHEMES.items() if s != SHA256)
        raise ValueError(f"unknown digest {token[:80]!r}; expected {known} or <64 hex>")
    return scheme


def stream_to_temp(path, produce: Callable[[atomic.HashingSink], None]) -> tuple:
    """`atomic.stream_to_temp` hashing with XXH3-128: (temp, ``xxh3-128:<hex>``, size)."""
    tmp, hexdigest, size = atomic.stream_to_temp(path, produce, xxhash.xxh3_128())
    return tmp, f"{WRITTEN}:{hexdigest}", size


def of_file(
    path: os.PathLike, scheme: str = WRITTEN, into: "Sequence[Piece]" = ()
) -> tuple[str, int]:
    """(token, size) of a file under ``scheme``, in one sequential read. Under XXH3 the bytes
    of each of ``into`` (in file order, none overlapping) are read straight into its buffer and
    hashed there (`hpcddp.storage.into_place`); the other schemes leave ``into`` alone."""
    if scheme == SHA256_CHUNKS:
        hexdigest, size = _sha256_chunks_of(path)
        return f"{SHA256_CHUNKS}:{hexdigest}", size
    hasher = xxhash.xxh3_128() if scheme == XXH3 else hashlib.sha256()
    scratch = memoryview(bytearray(READ_BYTES))
    with open(path, "rb", buffering=0) as handle:
        size = 0
        for piece in into if scheme == XXH3 else ():
            if piece.offset < size:
                raise ValueError(f"pieces out of file order or overlapping at {piece.offset}")
            size += read_hashing(handle, hasher, scratch, piece.offset - size, reuse=True)
            if size < piece.offset:
                break  # the file ends before this piece: truncated, and the digest says so
            size += read_hashing(handle, hasher, piece.buffer, len(piece.buffer))
        size += read_hashing(handle, hasher, scratch, None, reuse=True)
    return (f"{XXH3}:" if scheme == XXH3 else "") + hasher.hexdigest(), size


def read_hashing(handle, hasher, buffer: memoryview, count: int | None, reuse=False) -> int:
    """Read ``count`` bytes (None: to the end of the file) into ``buffer`` and hash them, a
    chunk at a time (the disk reads ahead while a chunk is hashed). ``reuse``: refill the
    buffer from its start for each chunk; otherwise fill it once, front to back. Returns the
    bytes read, fewer than ``count`` where the file ends first."""
    total = 0
    while count is None or total < count:
        start = 0 if reuse else total
        want = READ_BYTES if count is None else min(READ_BYTES, count - total)
        chunk = buffer[start : start + want]
        n = handle.readinto(chunk)
        if not n:
            break
        hasher.update(chunk[:n])
        total += n
    return total


def combine(chunk_hex: list[str]) -> str:
    """The older chunked digest of a file from its chunks' hex sha256s, in order."""
    return hashlib.sha256("".join(f"{h}\n" for h in chunk_hex).encode("ascii")).hexdigest()


def _sha256_chunks_of(path: os.PathLike) -> tuple[str, int]:
    """The older chunked sha256 (hex, size): one read, chunks hashed on 2 threads."""
    buffers = [bytearray(CHUNK_BYTES) for _ in range(_THREADS + 1)]
    hashing: list[Future | None] = [None] * len(buffers)
    digests: list[Future] = []
    size = 0
    with open(path, "rb", buffering=0) as handle, ThreadPoolExecutor(_THREADS) as pool:
        for index in range(1 << 62):
            slot = index % len(buffers)
            previous = hashing[slot]
            if previous is not None:
                previous.result()  # its buffer is free again
            n = _fill(handle, buffers[slot])
            if not n:
                break
            view = memoryview(buffers[slot])[:n]
            hashing[slot] = future = pool.submit(lambda v: hashlib.sha256(v).hexdigest(), view)
            digests.append(future)
            size += n
        chunk_hex = [d.result() for d in digests]
    return combine(chunk_hex), size


def _fill(handle, buffer: bytearray) -> int:
    """Read until ``buffer`` is full or the file ends (a read may return less: NFS, signals)."""
    view, n = memoryview(buffer), 0
    while n < len(buffer) and (got := handle.readinto(view[n:])):
        n += got
    return n
