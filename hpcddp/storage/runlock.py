"""One run at a time per run directory: ``RUN_DIR/.lock``, held by rank 0 for the run's life.

Two jobs started on the same run directory would interleave their checkpoints and metrics and
prune each other's files. The lock is an ``flock`` on ``RUN_DIR/.lock`` (released by the kernel
however the holder dies, and honoured across nodes by NFSv4, GPFS and Lustre mounted with
``flock``); the file says who holds it, so the second run is refused naming the first one's
host, pid and job. Where the file system has no flock, an exclusively created file stands in,
and a lock left by a dead process of this host, or by an earlier attempt of this very Slurm
job (a requeue), is taken over.
"""

import errno
import fcntl
import json
import logging
import os
import pathlib
import socket
import time
from typing import Any

from hpcddp.errors import ConfigError

log = logging.getLogger(__name__)

_NO_FLOCK = {errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}


def _me(job_id: str) -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "job_id": job_id,
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


class RunLock:
    """Rank 0's claim on a run directory; `acquire` refuses if another live run holds it.

    ``job_id`` is the job this process belongs to (`DistEnv.job_id`; "" outside a job): a lock
    file left by an earlier attempt of the same job is stale.
    """

    def __init__(self, run_dir: pathlib.Path, job_id: str = "") -> None:
        self.path = run_dir / ".lock"
        self.job_id = job_id
        self._fd: int | None = None
        self._exclusive_file = False

    def acquire(self) -> None:
        """Take the lock or raise a ConfigError that names the run holding it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in _NO_FLOCK:
                self._acquire_exclusive_file()
                return
            raise self._held(self._holder()) from None
        self._fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(_me(self.job_id)).encode())

    def release(self) -> None:
        """Let the next run in (the kernel also does this if the process dies)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._exclusive_file:
            self.path.unlink(missing_ok=True)
            self._exclusive_file = False

    def _acquire_exclusive_file(self) -> None:
        """Without flock: create the file exclusively, taking over one that is clearly stale."""
        holder = self._holder()
        if holder and not _stale(holder, self.job_id):
            raise self._held(holder)
        self.path.unlink(missing_ok=True)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:  # another run won the race just now
            raise self._held(self._holder()) from None
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(_me(self.job_id)))
        self._exclusive_file = True
        log.info("%s has no flock; holding the run directory with an exclusive file", self.path)

    def _holder(self) -> dict[str, Any]:
        try:
            found = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def _held(self, holder: dict[str, Any]) -> ConfigError:
        who = ", ".join(
            f"{key} {holder[key]}" for key in ("host", "pid", "job_id", "since") if holder.get(key)
        )
        return ConfigError(
            f"run directory {self.path.parent} is in use by another run ({who or 'unknown'}). "
            "HINT: wait for it to end, or give this run its own run.dir."
        )


def _stale(holder: dict[str, Any], job_id: str) -> bool:
    """A lock file whose writer is gone: a dead pid on this host, or this job's earlier attempt."""
    if job_id and holder.get("job_id") == job_id:
        return True
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(holder.get("pid", 0)), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):
        return False
    return False


def holder(run_dir: pathlib.Path) -> dict[str, Any] | None:
    """Who holds ``run_dir`` now (host, pid, job_id, since), or None if no run does (asked from
    outside any job: only a dead pid of this host makes a lock file stale)."""
    lock = RunLock(run_dir)
    try:
        fd = os.open(lock.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        held = err.errno not in _NO_FLOCK or not _stale(lock._holder(), "")
        return lock._holder() if held else None
    finally:
        os.close(fd)  # closing also drops the shared lock taken to look
    return None
