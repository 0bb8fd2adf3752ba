"""Keep the one c10d warning nobody can act on out of the user's output.

When a TCPStore client connects, c10d formats the socket's address for a log line with a
reverse DNS lookup, and on nodes whose resolver cannot answer (no DNS server reachable, an
address missing from /etc/hosts) every rank prints "The hostname of the client socket cannot
be retrieved. err=-3". It is printed by C++ straight to file descriptor 2 whatever the log
level, so it is filtered there, only while the store connects; every other line passes through.
"""

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

NOISE = (b"The hostname of the client socket cannot be retrieved",)


def _pump(read_fd: int, write_fd: int, noise: tuple[bytes, ...]) -> None:
    """Copy lines from ``read_fd`` to ``write_fd``, leaving out the noisy ones."""
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        for line in iter(source.readline, b""):
            if not any(pattern in line for pattern in noise):
                os.write(write_fd, line)


@contextlib.contextmanager
def c10d_noise_filtered(noise: tuple[bytes, ...] = NOISE) -> Iterator[None]:
    """Filter file descriptor 2 for the duration of the block (best effort, never fatal)."""
    try:
        saved = os.dup(2)
        read_fd, write_fd = os.pipe()
    except OSError:  # no stderr to filter
        yield
        return
    sys.stderr.flush()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    pump = threading.Thread(target=_pump, args=(read_fd, saved, noise), daemon=True)
    pump.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the pump sees EOF and ends
        pump.join(timeout=5)
        os.close(saved)
