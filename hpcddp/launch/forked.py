"""A local launch's ranks, forked by one zygote that loaded torch for all of them.

`start` runs the zygote (`hpcddp.cli.zygote`), hands it each rank's arguments and environment,
and returns one `ForkedRank` per rank: what `subprocess.Popen` offers the launcher
(``pid``, ``poll``, ``returncode``, ``wait``, ``send_signal``, ``kill``), the exit statuses told
by the zygote, the ranks' parent. The ranks keep the launcher's standard streams, process group
and directory. The zygote dies with the launcher (``PR_SET_PDEATHSIG``, SIGKILL: it ignores
the ranks' signals), and the ranks with the zygote.
"""

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from hpcddp.errors import LaunchError


class Zygote:
    """The zygote's process and what it has told so far."""

    def __init__(self, process: subprocess.Popen[bytes], events_fd: int, size: int) -> None:
        self.process, self.size = process, size
        self._events = events_fd
        self._pending = b""
        self.pids: dict[int, int] = {}  # rank -> pid
        self.codes: dict[int, int] = {}  # rank -> exit status, Popen's way (-N: signal N)
        self.gone = False  # its events have ended: it told everything, or it died
        self._hearing = False  # the launcher's signal handlers poll too: one reader at a time

    def hear(self, timeout_s: float) -> None:
        """Read what the zygote says within ``timeout_s`` (0: only what is there already)."""
        if self.gone or self._hearing:
            return
        self._hearing = True
        try:
            self._hear(timeout_s)
        finally:
            self._hearing = False

    def _hear(self, timeout_s: float) -> None:
        if not select.select([self._events], [], [], timeout_s)[0]:
            return
        chunk = os.read(self._events, 65536)
        if not chunk:
            self._lost()
            return
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            event = json.loads(line)
            if "pid" in event:
                self.pids[event["rank"]] = event["pid"]
            else:
                self.codes[event["rank"]] = event["code"]
        if len(self.codes) == self.size:  # all told: it is leaving
            self._lost()

    def _lost(self) -> None:
        """No more events: reaped. A rank not told ended is ended now (its parent gone, the
        kernel's SIGTERM has reached it; SIGKILL if it still runs), and read as killed."""
        self.gone = True
        os.close(self._events)
        status = self.process.wait()
        left = [rank for rank in self.pids if rank not in self.codes]
        for rank in left:
            _kill(self.pids[rank], signal.SIGKILL)
            self.codes[rank] = -signal.SIGKILL
        if left:
            print(
                f"hpcddp: error: the ranks' zygote (pid {self.process.pid}) ended with status "
                f"{status} while local rank(s) {left} ran: they were ended. HINT: a negative "
                "status is a signal (-9: the kernel's out-of-memory killer, or a hard kill)",
                file=sys.stderr,
                flush=True,
            )


class ForkedRank:
    """One rank, as the launcher sees it (`subprocess.Popen`'s calls)."""

    def __init__(self, zygote: Zygote, rank: int) -> None:
        self._zygote, self._rank = zygote, rank
        self.pid = zygote.pids[rank]

    @property
    def returncode(self) -> int | None:
        return self._zygote.codes.get(self._rank)

    def poll(self) -> int | None:
        self._zygote.hear(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"rank {self._rank}", timeout or 0)
            self._zygote.hear(min(left, 1.0))
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reaped: the pid is still this rank's
            _kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(argv: Sequence[str], envs: Sequence[Mapping[str, str]]) -> list[ForkedRank]:
    """One rank per environment of ``envs``, each running ``python -m hpcddp <argv>``; returns
    once every rank is forked."""
    jobs_r, jobs_w = os.pipe()
    events_r, events_w = os.pipe()
    me = os.getpid()
    process = subprocess.Popen(
        [sys.executable, "-m", "hpcddp.cli.zygote", str(jobs_r), str(events_w)],
        pass_fds=(jobs_r, events_w),
        preexec_fn=lambda: die_with(me, signal.SIGKILL),  # the launcher is single-threaded here
    )
    os.close(jobs_r)
    os.close(events_w)
    with os.fdopen(jobs_w, "w") as jobs:
        for env in envs:
            print(json.dumps({"argv": list(argv), "env": dict(env)}), file=jobs)
    zygote = Zygote(process, events_r, len(envs))
    while len(zygote.pids) < len(envs) and not zygote.gone:
        zygote.hear(1.0)
    if len(zygote.pids) < len(envs):
        raise LaunchError(
            f"the local launch's zygote ended (exit status {process.returncode}) before it "
            f"started {len(envs)} rank(s). HINT: run `{sys.executable} -m hpcddp` alone to see "
            "why it cannot start"
        )
    return [ForkedRank(zygote, rank) for rank in range(len(envs))]


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with(parent_pid: int, sig: int) -> None:
    """In a child (before exec, or just forked): ``sig`` when its parent's thread dies (Linux;
    else nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # it died before the request took effect
        os.kill(os.getpid(), sig)


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already ended
        os.kill(pid, sig)
