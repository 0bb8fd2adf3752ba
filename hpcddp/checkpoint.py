"""Rank-0 checkpoint storage that never loses work and never hands resume a broken file.

Layout: ``<run_dir>/checkpoints/step-00000123.pt`` plus a sidecar ``step-00000123.pt.sha256``
(``sha256sum`` format) holding the digest of the payload bytes.

Why it is crash-safe: the payload goes to a dot-prefixed temp file, the sidecar to another;
both are fsynced, the sidecar is renamed into place, then the payload, then the directory is
fsynced. Resume only looks at ``step-*.pt`` names and only loads one whose bytes match its
sidecar, so a kill at any point leaves either a complete verified checkpoint or debris that
resume ignores (temp files, a sidecar without its ``.pt``, a ``.pt`` without a sidecar) and the
next save removes. When a step is saved again, the sidecar lists the old and the new digest
until the rename is done, so the old payload stays verifiable throughout.

Why ``torch.save`` writes into our own sink rather than a path: the sink hashes exactly the
bytes that reach the disk while they stream past (no second copy of the model in memory), merges
torch's many tiny writes into large ones, and keeps the real ``OSError(ENOSPC)``; torch itself
reports a full disk only as ``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected
pos N vs M``, with no errno.
"""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import os
import pathlib
import re
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch

from hpcddp.errors import CheckpointError

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^step-(\d{8,})\.pt$")
# Temp files of atomic writes: ".<final name>.tmp-<host>-<pid>". The leading dot keeps them
# from ever matching _NAME_RE.
_TEMP_RE = re.compile(r"^\.(?P<final>.+)\.tmp-(?P<host>.+)-(?P<pid>\d+)$")
_SIDECAR_SUFFIX = ".sha256"
_WRITE_CHUNK_BYTES = 64 << 20  # Bounded single write() calls; large enough to stay fast.
_SMALL_PIECE_BYTES = 64 << 10  # torch.save emits ~5 tiny writes per tensor; these get merged...
_MERGED_WRITE_BYTES = 4 << 20  # ...into writes of about this size.
_FOREIGN_TEMP_MAX_AGE_S = 3600.0  # A temp from another host this old belongs to a dead job.
_DISK_FULL_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded"}


# ---------------------------------------------------------------------------------------------
# Atomic file writes (also used by the trainer for summary.json and config files)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never a mix.

    Raises ``OSError`` (the temp file is removed first); callers turn it into their own error.
    """
    path = pathlib.Path(path)
    tmp = _write_temp(path, data)
    try:
        _commit(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """``atomic_write_bytes`` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def _temp_name(path: pathlib.Path) -> pathlib.Path:
    """Temp sibling of ``path``; host and pid let a later save tell whether its writer is dead."""
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def _open_temp(path: pathlib.Path) -> tuple[pathlib.Path, int]:
    """Create a fresh temp sibling of ``path``; return it and a write descriptor."""
    tmp = _temp_name(path)
    _unlink_quietly(tmp)  # Left by an earlier attempt of this very process.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    return tmp, os.open(tmp, flags, 0o666)


def _write_temp(path: pathlib.Path, data: bytes | memoryview, fsync: bool = True) -> pathlib.Path:
    """Write ``data`` to a temp file next to ``path`` (fsynced unless told); return its path."""
    tmp, fd = _open_temp(path)
    try:
        _write_all(fd, memoryview(data).cast("B"))
        if fsync:
            os.fsync(fd)  # Data must be on disk before the rename makes it visible.
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp


def _fsync_file(path: pathlib.Path) -> None:
    """fsync an already written file by name (Linux flushes the inode whatever the fd mode)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, view: memoryview) -> None:
    """Write every byte; ``os.write`` may write less than asked (signals, network filesystems)."""
    offset = 0
    while offset < len(view):
        offset += os.write(fd, view[offset : offset + _WRITE_CHUNK_BYTES])


def _commit(tmp: pathlib.Path, path: pathlib.Path) -> None:
    """Rename ``tmp`` over ``path`` and make the rename itself durable."""
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: pathlib.Path) -> None:
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


def _unlink_quietly(path: pathlib.Path) -> None:
    """Remove ``path`` if it exists; cleanup must not mask the error that triggered it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)


# ---------------------------------------------------------------------------------------------
# Checkpoint store


class CheckpointStore:
    """Step-numbered checkpoints in ``<run_dir>/checkpoints/step-00000123.pt``.

    Save only on rank 0; load on every rank. Constructing a store touches no files, so every
    rank may build one.
    """

    def __init__(self, run_dir: str | os.PathLike, keep_last: int = 3):
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise CheckpointError(
                f"keep_last={keep_last!r} is invalid; expected an integer >= 1. "
                "HINT: set train.keep_checkpoints to 1 or more."
            )
        self.run_dir = pathlib.Path(run_dir)
        self.directory = self.run_dir / "checkpoints"
        self.keep_last = keep_last

    # -- naming ---------------------------------------------------------------------------------

    def path_for(self, step: int) -> pathlib.Path:
        """Final path of the checkpoint for ``step``."""
        return self.directory / f"step-{step:08d}.pt"

    @staticmethod
    def _sidecar(path: pathlib.Path) -> pathlib.Path:
        return path.with_name(path.name + _SIDECAR_SUFFIX)

    # -- listing --------------------------------------------------------------------------------

    def list_complete(self) -> list[tuple[int, pathlib.Path]]:
        """``(step, path)`` of every finished checkpoint name, oldest first (not yet verified)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CheckpointError(
                f"cannot list checkpoint directory {self.directory}: {exc}. "
                "HINT: check that run.dir points at a readable directory."
            ) from exc
        found = [(int(m.group(1)), self.directory / n) for n in names if (m := _NAME_RE.match(n))]
        return sorted(found)

    def latest_step(self) -> int | None:
        """Step of the newest finished checkpoint name, or None if there is none."""
        complete = self.list_complete()
        return complete[-1][0] if complete else None

    # -- saving ---------------------------------------------------------------------------------

    def save(self, step: int, state: dict) -> pathlib.Path:
        """Write ``state`` as the checkpoint for ``step`` crash-safely, then prune old ones.

        Raises ``CheckpointError`` on any failure; earlier checkpoints are then untouched.
        """
        _check_step(step)
        if not isinstance(state, dict):
            raise CheckpointError(
                f"checkpoint state for step {step} is a {type(state).__name__}; expected a dict. "
                "HINT: pass a dict such as {'model': model.state_dict(), ...}."
            )
        self._make_directory()
        try:
            self._remove_debris()
        except OSError as exc:  # Tidying up must never block a save.
            log.warning("could not clean temp files in %s: %s", self.directory, exc)
        started = time.perf_counter()
        path = self.path_for(step)
        try:
            nbytes = self._write_checkpoint(path, step, state)
        except OSError as exc:
            raise self._write_error(step, exc, _tensor_bytes(state)) from exc
        elapsed = time.perf_counter() - started
        log.info(
            "saved checkpoint %s (%.1f MB in %.2f s, %.0f MB/s)",
            path, nbytes / 1e6, elapsed, nbytes / 1e6 / max(elapsed, 1e-9),
        )
        self._prune(keep_step=step)
        return path

    def _make_directory(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(
                f"cannot create checkpoint directory {self.directory}: {exc.strerror or exc}; "
                "expected a writable directory. HINT: point run.dir at a writable location."
            ) from exc

    def _write_checkpoint(self, path: pathlib.Path, step: int, state: dict) -> int:
        """Payload temp, sidecar, then the payload rename (see the module docstring).

        Both temps are written before either is fsynced, so ext4 (data=ordered) flushes both
        in one journal commit; one directory fsync then covers both renames, which journaling
        filesystems persist in order. Returns the payload size in bytes.
        """
        sidecar = self._sidecar(path)
        tmp, digest, nbytes = _save_to_temp(path, step, state)
        temps = [tmp]
        try:
            digests = list(dict.fromkeys([*_old_digests(path, sidecar), digest]))
            temps.append(_write_temp(sidecar, _sidecar_text(path, digests), fsync=False))
            _fsync_file(tmp)
            _fsync_file(temps[1])
            os.replace(temps[1], sidecar)
            if len(digests) > 1:  # Replacing a step: its old payload must stay verifiable.
                _fsync_dir(self.directory)
            _commit(tmp, path)
        except BaseException:
            for temp in temps:
                _unlink_quietly(temp)
            if not path.exists():
                _unlink_quietly(sidecar)
            raise
        if len(digests) > 1:  # Old payload is gone; keep only the digest that matches now.
            atomic_write_bytes(sidecar, _sidecar_text(path, [digest]))
        return nbytes

    def _write_error(self, step: int, exc: OSError, tensor_bytes: int) -> CheckpointError:
        """Turn an OSError from writing into a one-line CheckpointError with the fix."""
        what = _DISK_FULL_ERRNOS.get(exc.errno)
        if what is None:
            return CheckpointError(
                f"checkpoint step {step} not saved to {self.directory}: {exc}; previous "
                "checkpoints are intact. HINT: check that run.dir is writable and healthy."
            )
        free = _free_bytes(self.directory)
        free_text = f", {free} bytes free" if free is not None else ""
        return CheckpointError(
            f"checkpoint step {step} not saved: {what} ({exc.strerror}) in {self.directory}; "
            f"needed at least {tensor_bytes} bytes{free_text}; previous checkpoints are intact. "
            "HINT: free space there (or lower train.keep_checkpoints), or point run.dir at a "
            "filesystem with room."
        )

    def _prune(self, keep_step: int) -> None:
        """Delete checkpoints beyond the newest ``keep_last``, never the one just written."""
        complete = self.list_complete()
        keep = {s for s, _ in complete[-self.keep_last :]} | {keep_step}
        for step, path in complete:
            if step in keep:
                continue
            _unlink_quietly(path)  # Payload first: a lone sidecar is ignored, a lone .pt is not.
            _unlink_quietly(self._sidecar(path))
            log.debug("pruned checkpoint %s", path)

    def _remove_debris(self) -> None:
        """Delete what interrupted saves left behind; none of it is ever loaded anyway."""
        host = socket.gethostname()
        for name in os.listdir(self.directory):
            path = self.directory / name
            if _is_debris(path, host):
                log.info("removing %s, left behind by an interrupted save", path)
                _unlink_quietly(path)

    # -- loading --------------------------------------------------------------------------------

    def load_latest(self, map_location="cpu") -> tuple[int, dict] | None:
        """Newest checkpoint that verifies and loads safely, as ``(step, state)``.

        Falls back past broken ones with a warning. Returns None if there are no checkpoints;
        raises if there are some but none is usable, so a run never silently restarts at 0.
        """
        complete = self.list_complete()
        for step, path in reversed(complete):
            try:
                return step, self.load(path, map_location=map_location)
            except CheckpointError as exc:
                log.warning("skipping checkpoint %s: %s", path, exc)
        if complete:
            raise CheckpointError(
                f"none of the {len(complete)} checkpoints in {self.directory} is usable (see "
                "warnings above); expected at least one that verifies. HINT: restore one from "
                "backup, or move the directory away to deliberately start from scratch."
            )
        return None

    def load(self, path: str | os.PathLike, map_location="cpu") -> dict:
        """Verify ``path`` against its sidecar and load it with ``weights_only=True``."""
        path = pathlib.Path(path)
        data = _read_verified(path, self._sidecar(path))
        try:
            state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
        except Exception as exc:  # Unpickling errors come in many types; all mean "unusable".
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(
                f"checkpoint {path} cannot be loaded safely ({type(exc).__name__}: {reason}); "
                "expected tensors and plain Python values only. HINT: it may be corrupt or "
                "contain arbitrary objects; resume falls back to an older checkpoint."
            ) from exc
        if not isinstance(state, dict):
            raise CheckpointError(
                f"checkpoint {path} holds a {type(state).__name__}; expected a dict. "
                "HINT: it was not written by hpcddp; move it out of the checkpoints directory."
            )
        return state


# ---------------------------------------------------------------------------------------------
# Helpers


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(
            f"checkpoint step {step!r} is invalid; expected an integer >= 0. "
            "HINT: pass the global optimizer step."
        )


def _save_to_temp(path: pathlib.Path, step: int, state: dict) -> tuple[pathlib.Path, str, int]:
    """``torch.save`` straight into a temp file (not yet fsynced); returns (temp, sha256, size)."""
    tmp, fd = _open_temp(path)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="hpcddp-ckpt-sha256") as pool:
            sink = _HashingSink(fd, pool)
            _torch_save(step, state, sink)
            digest = sink.finish()
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp, digest, sink.nbytes


def _sidecar_text(path: pathlib.Path, digests: list[str]) -> bytes:
    """``sha256sum`` format, so ``sha256sum -c step-00000123.pt.sha256`` checks it by hand."""
    return "".join(f"{d}  {path.name}\n" for d in digests).encode("ascii")


def _torch_save(step: int, state: dict, sink: "_HashingSink") -> None:
    """``torch.save`` that surfaces the sink's OSError instead of torch's opaque RuntimeError."""
    try:
        with _torch_crc32_disabled():
            torch.save(state, sink)
    except Exception as exc:
        if sink.error is not None:
            raise sink.error from None  # e.g. ENOSPC; torch only says "unexpected pos N vs M".
        raise CheckpointError(
            f"checkpoint state for step {step} cannot be serialised: {type(exc).__name__}: "
            f"{exc}. HINT: store only tensors, numbers, strings, lists and dicts."
        ) from exc


@contextmanager
def _torch_crc32_disabled():
    """Skip torch's per-record CRC32: our sha256 covers every byte, and torch.load never checks
    the CRC anyway (a flipped byte loads silently). Saves a full pass over the data."""
    getter = getattr(torch.serialization, "get_crc32_options", None)
    if getter is None:
        yield
        return
    previous = getter()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(previous)


class _HashingSink:
    """File-like target for ``torch.save``: hashes and writes what it is given, in order.

    Why: one pass over the bytes, no in-memory copy of the checkpoint, sha256 running on a
    helper thread while the same bytes are written (both release the GIL), and torch's ~5 tiny
    writes per tensor merged into large ones.
    """

    def __init__(self, fd: int, pool: ThreadPoolExecutor):
        self._fd = fd
        self._pool = pool
        self._sha = hashlib.sha256()
        self._pending = bytearray()
        self.nbytes = 0
        self.error: OSError | None = None  # torch hides it behind a RuntimeError.

    def write(self, data) -> int:
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
        """Write what is still pending; return the sha256 of everything written."""
        self._drain()
        return self._sha.hexdigest()

    def _drain(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, bytearray()
            self._emit(memoryview(pending))

    def _emit(self, view: memoryview) -> None:
        hashing = self._pool.submit(self._sha.update, view)
        try:
            _write_all(self._fd, view)
        finally:
            hashing.result()


def _tensor_bytes(obj) -> int:
    """Bytes of tensor data in a nested state: a lower bound on the checkpoint size."""
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _read_digests(sidecar: pathlib.Path) -> list[str]:
    """Hex digests listed in a ``sha256sum``-format sidecar (one per line)."""
    digests = []
    for line in sidecar.read_text(encoding="ascii").splitlines():
        token = line.split(" ", 1)[0].strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", token):
            raise ValueError(f"malformed line {line[:80]!r}")
        digests.append(token)
    if not digests:
        raise ValueError("no digest in it")
    return digests


def _old_digests(path: pathlib.Path, sidecar: pathlib.Path) -> list[str]:
    """Digests that keep an existing ``path`` verifiable while it is being replaced."""
    if not path.exists():
        return []
    try:
        return _read_digests(sidecar)
    except (OSError, UnicodeDecodeError, ValueError):
        return []  # The old payload was unverifiable anyway; nothing to preserve.


def _read_verified(path: pathlib.Path, sidecar: pathlib.Path) -> bytes:
    """Bytes of ``path`` if their sha256 is listed in ``sidecar``; CheckpointError otherwise."""
    try:
        digests = _read_digests(sidecar)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path} has no valid integrity record {sidecar.name} ({exc}); expected "
            "one written by save(). HINT: the save was interrupted or the file was copied "
            "without it; resume falls back to an older checkpoint."
        ) from exc
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint {path} cannot be read: {exc}. HINT: check the filesystem and permissions."
        ) from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual not in digests:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: sha256 {actual[:16]}... of its {len(data)} bytes does "
            f"not match {sidecar.name}; expected {digests[-1][:16]}... HINT: it was truncated or "
            "altered after saving; resume falls back to an older checkpoint."
        )
    return data


def _is_debris(path: pathlib.Path, host: str) -> bool:
    """A temp file whose writer is dead, or a sidecar whose checkpoint was never renamed."""
    if (m := _TEMP_RE.match(path.name)) is not None:
        final = m["final"].removesuffix(_SIDECAR_SUFFIX)
        return bool(_NAME_RE.match(final)) and _temp_is_stale(path, m["host"], int(m["pid"]), host)
    if path.name.endswith(_SIDECAR_SUFFIX):
        payload = path.with_name(path.name.removesuffix(_SIDECAR_SUFFIX))
        return bool(_NAME_RE.match(payload.name)) and not payload.exists()
    return False


def _temp_is_stale(path: pathlib.Path, temp_host: str, pid: int, host: str) -> bool:
    """True when the process that wrote temp file ``path`` cannot still be writing it."""
    if temp_host != host:
        try:
            return time.time() - path.stat().st_mtime > _FOREIGN_TEMP_MAX_AGE_S
        except OSError:
            return False
    if pid == os.getpid():
        return False  # Ours: _write_temp replaces it itself.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # Exists but owned by someone else.
    return False


def _free_bytes(directory: pathlib.Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None
