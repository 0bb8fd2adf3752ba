"""Durable, atomic file writes: readers see the old file or the new one, never a mix.

Why a module of its own: the checkpoint store, the run directory (config.yaml) and the trainer
(summary.json) all replace files that a crash must never leave half written. Each write goes to
a dot-prefixed temp sibling, is fsynced, renamed over the target, and the directory is fsynced
so the rename itself survives a power loss.

Temp files are named ``.<final name>.tmp-<host>-<pid>``: the leading dot keeps them out of name
patterns that do not start with a dot, and host and pid let a later writer tell whether the
process that left one behind can still be writing it (``temp_writer_is_dead``).

``HashingSink`` is the file-like target for streaming writers such as ``torch.save``: it hashes
exactly the bytes that reach the disk while they stream past (no second copy in memory), merges
many tiny writes into large ones, and keeps the real ``OSError`` (e.g. ``ENOSPC``) that a caller
like torch would otherwise hide behind its own exception.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import pathlib
import re
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Protocol

log = logging.getLogger(__name__)

_TEMP_RE = re.compile(r"^\.(?P<final>.+)\.tmp-(?P<host>.+)-(?P<pid>\d+)$")
_WRITE_CHUNK_BYTES = 64 << 20  # Bounded single write() calls; large enough to stay fast.
_SMALL_PIECE_BYTES = 64 << 10  # torch.save emits ~5 tiny writes per tensor; these get merged...
_MERGED_WRITE_BYTES = 4 << 20  # ...into writes of about this size.
_FOREIGN_TEMP_MAX_AGE_S = 3600.0  # A temp from another host this old belongs to a dead job.


# ---------------------------------------------------------------------------------------------
# Whole-file writes


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never a mix.

    Raises ``OSError`` (the temp file is removed first); callers turn it into their own error.
    """
    path = pathlib.Path(path)
    tmp = write_temp(path, data)
    try:
        commit(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """``atomic_write_bytes`` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# Building blocks, for writers that commit several files in a chosen order


def write_temp(path: pathlib.Path, data: bytes | memoryview, fsync: bool = True) -> pathlib.Path:
    """Write ``data`` to a temp file next to ``path`` (fsynced unless told); return its path.

    ``fsync=False`` lets a caller write several temps first and fsync them together later
    (``fsync_file``), which journaling filesystems flush in one commit.
    """
    with _temp_file(path) as (tmp, fd):
        write_all(fd, memoryview(data).cast("B"))
        if fsync:
            os.fsync(fd)  # Data must be on disk before the rename makes it visible.
    return tmp


def stream_to_temp(
    path: pathlib.Path, produce: Callable[[HashingSink], None], hasher: Hasher | None = None
) -> tuple[pathlib.Path, str, int]:
    """Let ``produce`` write into a temp file next to ``path`` through a ``HashingSink``.

    Returns ``(temp, hex digest, size in bytes)``, the digest ``hasher``'s (sha256 unless
    given); the temp is not yet fsynced.
    """
    with (
        _temp_file(path) as (tmp, fd),
        ThreadPoolExecutor(1, thread_name_prefix="hpcddp-hash") as pool,
    ):
        sink = HashingSink(fd, pool, hasher)
        produce(sink)
        digest = sink.finish()
    return tmp, digest, sink.nbytes


def write_all(fd: int, view: memoryview) -> None:
    """Write every byte; ``os.write`` may write less than asked (signals, network filesystems)."""
    offset = 0
    while offset < len(view):
        offset += os.write(fd, view[offset : offset + _WRITE_CHUNK_BYTES])


def fsync_file(path: pathlib.Path) -> None:
    """fsync an already written file by name (Linux flushes the inode whatever the fd mode)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: pathlib.Path, path: pathlib.Path) -> None:
    """Rename ``tmp`` over ``path`` and make the rename itself durable."""
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: pathlib.Path) -> None:
    """Persist directory entries; some filesystems refuse fsync on directories, which is fine."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
        log.debug("fsync of directory %s not supported: %s", directory, exc)
    finally:
        os.close(fd)


def unlink_quietly(path: pathlib.Path) -> None:
    """Remove ``path`` if it exists; cleanup must not mask the error that triggered it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)


@contextmanager
def _temp_file(path: pathlib.Path) -> Iterator[tuple[pathlib.Path, int]]:
    """A fresh temp sibling of ``path`` and a write descriptor; the temp goes if the body fails."""
    tmp = path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    unlink_quietly(tmp)  # Left by an earlier attempt of this very process.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o666)
    try:
        yield tmp, fd
    except BaseException:
        os.close(fd)
        unlink_quietly(tmp)
        raise
    os.close(fd)


# ---------------------------------------------------------------------------------------------
# Temp files left behind by killed writers


def temp_target(name: str) -> str | None:
    """Final file name that temp file ``name`` was written for, or None if it is no temp."""
    m = _TEMP_RE.match(name)
    return m["final"] if m else None


def temp_writer_is_dead(path: pathlib.Path) -> bool:
    """True when the process that wrote temp file ``path`` cannot still be writing it."""
    m = _TEMP_RE.match(path.name)
    if m is None:
        return False
    if m["host"] != socket.gethostname():  # Cannot ask another host; go by age.
        try:
            return time.time() - path.stat().st_mtime > _FOREIGN_TEMP_MAX_AGE_S
        except OSError:
            return False
    pid = int(m["pid"])
    if pid == os.getpid():
        return False  # Ours: _temp_file replaces it itself.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # Exists but owned by someone else.
    return False


# ---------------------------------------------------------------------------------------------
# Streaming sink


class Hasher(Protocol):
    """What a sink needs of a hash object: hashlib's and xxhash's both fit."""

    def update(self, data, /) -> None: ...

    def hexdigest(self) -> str: ...


class HashingSink:
    """File-like target for ``torch.save``: hashes and writes what it is given, in order.

    Why: one pass over the bytes, no in-memory copy of the data, the hash (sha256 unless
    ``hasher`` is given) running on a helper thread while the same bytes are written (both
    release the GIL), and torch's ~5 tiny writes per tensor merged into large ones. ``error``
    keeps the OSError that the caller may hide.
    """

    def __init__(self, fd: int, pool: ThreadPoolExecutor, hasher: Hasher | None = None):
        self._fd = fd
        self._pool = pool
        self._sha: Hasher = hasher if hasher is not None else hashlib.sha256()
        self._pending = bytearray()
        self.nbytes = 0
        self.error: OSError | None = None  # torch hides it behind a RuntimeError.

    def write(self, data) -> int:
        """Accept ``data`` (any buffer); small pieces are merged before they are written."""
        view = memoryview(data).cast("B")  # Only valid during this call: never kept.
        try:
            if len(view) < _SMALL_PIECE_BYTES:
                self._pending += view
                if len(self._pending) >= _MERGED_WRITE_BYTES:
                    self._drain()
            else:
                self._drain()
                self._emit(view)
        except OSError as exc:
            self.error = exc
            raise
        self.nbytes += len(view)
        return len(view)

    def flush(self) -> None:
        """Called by torch.save; the real flush happens in finish()."""

    def finish(self) -> str:
        """Write what is still pending; return the hex digest of everything written."""
        self._drain()
        return self._sha.hexdigest()

    def _drain(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, bytearray()
            self._emit(memoryview(pending))

    def _emit(self, view: memoryview) -> None:
        hashing = self._pool.submit(self._sha.update, view)
        try:
            write_all(self._fd, view)
        finally:
            hashing.result()
