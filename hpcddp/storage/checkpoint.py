"""Rank-0 checkpoint storage that never loses work and never hands resume a broken file.

Layout: ``<run_dir>/checkpoints/step-00000123.pt`` plus a sidecar ``step-00000123.pt.xxh3``
(``sha256sum``'s layout) holding the digest of the payload bytes: an XXH3-128 named by its
prefix, ``xxh3-128:<hex>`` (`hpcddp.storage.digest`, which says why, how to check it by hand
with ``xxhsum -H2``, and which older sha256 digests still verify). A sidecar of an earlier
version, ``step-00000123.pt.sha256``, is still read (`hpcddp.storage.checkpoint_names`).

Why it is crash-safe: the payload goes to a dot-prefixed temp file, the sidecar to another;
both are fsynced, the sidecar is renamed into place, then the payload, then the directory is
fsynced. Resume only looks at ``step-*.pt`` names and only loads one whose bytes match its
sidecar, so a kill at any point leaves either a complete verified checkpoint or debris that
resume ignores (temp files, a sidecar without its ``.pt``, a ``.pt`` without a sidecar) and the
next save removes. When a step is saved again, the sidecar lists the old and the new digest
until the rename is done, so the old payload stays verifiable throughout.

Why ``torch.save`` writes into a hashing sink (an ``atomic.HashingSink``) rather than a path:
the sink hashes the bytes while they stream to disk (no second copy of the model in memory, no
second pass) and keeps the real ``OSError(ENOSPC)``;
torch itself reports a full disk only as ``RuntimeError: [enforce fail at
inline_container.cc:672] . unexpected pos N vs M``, with no errno. The generic durable-write
machinery (temp files, fsyncs, renames) lives in ``hpcddp.storage.atomic``; this module decides
names, sidecars, ordering, pruning and what resume may load.

Loading maps the file (`hpcddp.storage.mapped`: tensors view the cached pages instead of a
copy) and verifies the digest in one streaming read (a fixed buffer, never the whole file in
memory) that can read the weights straight into the model on the way
(`hpcddp.storage.into_place`). `verify` and `load_verified` are separate so that one process
per node can verify for its neighbours.
"""

from __future__ import annotations

import errno
import logging
import os
import pathlib
import shutil
import time
from collections.abc import Sequence
from contextlib import contextmanager
from typing import IO, cast

import torch

from hpcddp.errors import CheckpointError
from hpcddp.run_files import CHECKPOINTS
from hpcddp.storage import atomic, digest, mapped, pruning
from hpcddp.storage.checkpoint_names import (
    CHECKPOINT_NAME,
    OLDER_SIDECAR_SUFFIXES,
    SIDECAR_SUFFIX,
    SIDECAR_SUFFIXES,
    file_name,
    payload_of,
)
from hpcddp.storage.into_place import Piece

log = logging.getLogger(__name__)

_DISK_FULL_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded"}


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
        self.directory = self.run_dir / CHECKPOINTS
        self.keep_last = keep_last

    # -- naming ---------------------------------------------------------------------------------

    def path_for(self, step: int) -> pathlib.Path:
        """Final path of the checkpoint for ``step``."""
        return self.directory / file_name(step)

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
        found = [
            (int(m.group(1)), self.directory / n) for n in names if (m := CHECKPOINT_NAME.match(n))
        ]
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
            nbytes = _write_checkpoint(path, step, state)
        except OSError as exc:
            raise _write_error(self.directory, step, exc, _tensor_bytes(state)) from exc
        elapsed = time.perf_counter() - started
        log.info(
            "saved checkpoint %s (%.1f MB in %.2f s, %.0f MB/s)",
            path,
            nbytes / 1e6,
            elapsed,
            nbytes / 1e6 / max(elapsed, 1e-9),
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

    def _prune(self, keep_step: int) -> None:
        """Delete checkpoints beyond the newest ``keep_last``, never the one just written;
        sharded ones (of a run that trained under fsdp before) count too."""
        pruning.prune(self.directory, self.keep_last, keep_step)

    def _remove_debris(self) -> None:
        """Delete what interrupted saves left behind; none of it is ever loaded anyway."""
        for name in os.listdir(self.directory):
            path = self.directory / name
            if _is_debris(path):
                log.info("removing %s, left behind by an interrupted save", path)
                atomic.unlink_quietly(path)

    # -- loading --------------------------------------------------------------------------------

    def verify(self, path: str | os.PathLike, into: Sequence[Piece] = ()) -> bool:
        """Raise ``CheckpointError`` unless the bytes of ``path`` match its sidecar. With
        ``into`` (`hpcddp.storage.into_place`), the same read fills those pieces; True when it
        did (a digest of the current scheme), whether or not the file then verifies."""
        return _verify(pathlib.Path(path), into)

    def load_verified(self, path: str | os.PathLike) -> dict:
        """Load ``path``, already verified, with tensors mapped from the file."""
        return _load_verified(pathlib.Path(path))


# ---------------------------------------------------------------------------------------------
# Helpers


def _write_checkpoint(path: pathlib.Path, step: int, state: dict) -> int:
    """Payload temp, sidecar, then the payload rename (see the module docstring).

    Both temps are written before either is fsynced, so ext4 (data=ordered) flushes both
    in one journal commit; one directory fsync then covers both renames, which journaling
    filesystems persist in order. Returns the payload size in bytes.
    """
    sidecar = _sidecar(path)
    tmp, new, nbytes = digest.stream_to_temp(path, lambda f: _torch_save(step, state, f))
    temps = [tmp]
    try:
        digests = list(dict.fromkeys([*_old_digests(path), new]))
        temps.append(atomic.write_temp(sidecar, _sidecar_text(path, digests), fsync=False))
        for temp in temps:
            atomic.fsync_file(temp)
        os.replace(temps[1], sidecar)
        if len(digests) > 1:  # Replacing a step: its old payload must stay verifiable.
            atomic.fsync_dir(path.parent)
        atomic.commit(tmp, path)
    except BaseException:
        for temp in temps:
            atomic.unlink_quietly(temp)
        if not path.exists():
            atomic.unlink_quietly(sidecar)
        raise
    if len(digests) > 1:  # Old payload is gone; keep only the digest that matches now.
        atomic.atomic_write_bytes(sidecar, _sidecar_text(path, [new]))
    for older in OLDER_SIDECAR_SUFFIXES:  # an earlier version's record of this step
        atomic.unlink_quietly(path.with_name(path.name + older))
    return nbytes


def _load_verified(path: pathlib.Path) -> dict:
    """Load ``path``, already verified, with tensors mapped from the file: a dict, or a
    CheckpointError saying why it cannot be used."""
    try:
        state = mapped.load(path)
    except Exception as exc:  # Unpickling errors come in many types; all mean "unusable".
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
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


def _write_error(
    directory: pathlib.Path, step: int, exc: OSError, tensor_bytes: int
) -> CheckpointError:
    """Turn an OSError from writing into a one-line CheckpointError with the fix."""
    what = _DISK_FULL_ERRNOS.get(exc.errno or 0)
    if what is None:
        return CheckpointError(
            f"checkpoint step {step} not saved to {directory}: {exc}; previous "
            "checkpoints are intact. HINT: check that run.dir is writable and healthy."
        )
    free = _free_bytes(directory)
    free_text = f", {free} bytes free" if free is not None else ""
    return CheckpointError(
        f"checkpoint step {step} not saved: {what} ({exc.strerror}) in {directory}; "
        f"needed at least {tensor_bytes} bytes{free_text}; previous checkpoints are intact. "
        "HINT: free space there (or lower train.keep_checkpoints), or point run.dir at a "
        "filesystem with room."
    )


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(
            f"checkpoint step {step!r} is invalid; expected an integer >= 0. "
            "HINT: pass the global optimizer step."
        )


def _sidecar(path: pathlib.Path) -> pathlib.Path:
    """The integrity record a save writes for checkpoint ``path``."""
    return path.with_name(path.name + SIDECAR_SUFFIX)


def _record_of(path: pathlib.Path) -> pathlib.Path:
    """The integrity record to read for ``path``: this version's, else an earlier one's."""
    for suffix in SIDECAR_SUFFIXES:
        record = path.with_name(path.name + suffix)
        if record.exists():
            return record
    return _sidecar(path)


def _sidecar_text(path: pathlib.Path, digests: list[str]) -> bytes:
    """``sha256sum``'s layout; each token names its scheme (`hpcddp.storage.digest`, which says
    how to check it by hand); a bare hex digest, as the first versions wrote, is a sha256."""
    return "".join(f"{d}  {path.name}\n" for d in digests).encode("ascii")


def _torch_save(step: int, state: dict, sink: atomic.HashingSink) -> None:
    """``torch.save`` that surfaces the sink's OSError instead of torch's opaque RuntimeError."""
    try:
        with _torch_crc32_disabled():
            torch.save(state, cast(IO[bytes], sink))  # torch only calls write() and flush()
    except Exception as exc:
        if sink.error is not None:
            raise sink.error from None  # e.g. ENOSPC; torch only says "unexpected pos N vs M".
        raise CheckpointError(
            f"checkpoint state for step {step} cannot be serialised: {type(exc).__name__}: "
            f"{exc}. HINT: store only tensors, numbers, strings, lists and dicts."
        ) from exc


@contextmanager
def _torch_crc32_disabled():
    """Skip torch's per-record CRC32: our digest covers every byte, and torch.load never checks
    the CRC anyway (a flipped byte loads silently). Saves a full pass over the data."""
    previous = torch.serialization.get_crc32_options()  # Present in every torch we support.
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(previous)


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
    """Digest tokens listed in a ``sha256sum``-format sidecar (one per line, scheme-prefixed)."""
    digests = []
    for line in sidecar.read_text(encoding="ascii").splitlines():
        token = line.split(" ", 1)[0].strip()
        digest.scheme_of(token)  # ValueError for a malformed line or an unknown scheme
        digests.append(token)
    if not digests:
        raise ValueError("no digest in it")
    return digests


def _old_digests(path: pathlib.Path) -> list[str]:
    """Digests that keep an existing ``path`` verifiable while it is being replaced."""
    if not path.exists():
        return []
    try:
        return _read_digests(_record_of(path))
    except (OSError, UnicodeDecodeError, ValueError):
        return []  # The old payload was unverifiable anyway; nothing to preserve.


def _verify(path: pathlib.Path, into: Sequence[Piece]) -> bool:
    """CheckpointError unless the digest of ``path`` is listed in its sidecar (one read, which
    fills ``into`` when the first scheme tried is the current one: True then)."""
    sidecar = _record_of(path)
    try:
        digests = _read_digests(sidecar)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path} has no valid integrity record {sidecar.name} ({exc}); expected "
            "one written by save(). HINT: the save was interrupted or the file was copied "
            "without it; resume falls back to an older checkpoint."
        ) from exc
    try:
        # Usually one scheme; two only while a step written by an older version is replaced.
        schemes = list(dict.fromkeys(digest.scheme_of(d) for d in reversed(digests)))
        filled = bool(into) and schemes[0] == digest.XXH3
        for scheme in schemes:
            actual, size = digest.of_file(path, scheme, into if scheme == schemes[0] else ())
            if actual in digests:
                return filled
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint {path} cannot be read: {exc}. HINT: check the filesystem and permissions."
        ) from exc
    raise CheckpointError(
        f"checkpoint {path} is corrupt: digest {_short(actual)} of its {size} bytes does "
        f"not match {sidecar.name}; expected {_short(digests[-1])}. HINT: it was truncated or "
        "altered after saving; resume falls back to an older checkpoint."
    )


def _short(token: str) -> str:
    return token.rsplit(":", 1)[-1][:16] + "..."


def _is_debris(path: pathlib.Path) -> bool:
    """A temp file whose writer is dead, or a sidecar whose checkpoint was never renamed."""
    if (final := atomic.temp_target(path.name)) is not None:
        return bool(CHECKPOINT_NAME.match(payload_of(final) or final)) and (
            atomic.temp_writer_is_dead(path)
        )
    payload = payload_of(path.name)
    if payload is not None:
        return bool(CHECKPOINT_NAME.match(payload)) and not path.with_name(payload).exists()
    return False


def _free_bytes(directory: pathlib.Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None
