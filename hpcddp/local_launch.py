"""``hpcddp train --nproc N``: N processes on this host, numbered by us, failing together.

The children find their place through ``HPCDDP_LOCAL_*`` variables (see
`hpcddp.environments.LocalContext`). If one child fails, the others are stopped at once rather
than left waiting in a collective until its timeout.
"""

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

log = logging.getLogger(__name__)

# Variables of an outer launcher that would make a child mistake its own place in the job.
_FOREIGN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "TORCHELASTIC_RUN_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SUBMITIT_LOCAL_GLOBALID")


def free_port() -> int:
    """A port the kernel says is free now (a local launch owns the whole host's view)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(rank: int, nproc: int, port: int, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of local rank ``rank`` of ``nproc``."""
    env = {k: v for k, v in base.items() if k not in _FOREIGN}
    env.update(HPCDDP_LOCAL_RANK=str(rank), HPCDDP_LOCAL_WORLD_SIZE=str(nproc),
               HPCDDP_LOCAL_JOB_ID=str(os.getpid()), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    return env


def launch(argv: Sequence[str], nproc: int) -> int:
    """Run ``python -m hpcddp <argv>`` in ``nproc`` processes; return the job's exit code."""
    port = int(os.environ.get("MASTER_PORT") or free_port())
    command = [sys.executable, "-m", "hpcddp", *argv]
    children = [subprocess.Popen(command, env=child_env(r, nproc, port, os.environ))
                for r in range(nproc)]
    # Ctrl-C already reaches the children (same process group); forward only what does not.
    previous = {s: signal.signal(s, lambda n, f: _forward(children, n))
                for s in (signal.SIGTERM, signal.SIGUSR2)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, lambda n, f: None)
    try:
        return _wait(children)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _forward(children: list[subprocess.Popen], signum: int) -> None:
    """Pass Ctrl-C / SIGTERM on to every child so they can stop cleanly."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signum)


def _wait(children: list[subprocess.Popen], grace_s: float = 10.0) -> int:
    """Wait for all; on the first failure stop the rest and return the failing code."""
    while True:
        codes = [c.poll() for c in children]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            print(f"hpcddp: local rank {rank} exited with code {code}; stopping the others",
                  file=sys.stderr)
            _stop(children, grace_s)
            return code if code > 0 else 128 - code
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.1)


def _stop(children: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM the survivors, then SIGKILL whoever is still there after ``grace_s``."""
    _forward(children, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
