"""``python -m hpcddp`` is the ``hpcddp`` command, as every rank runs it (srun, --nproc, torchrun).

A command that succeeded leaves without the interpreter's teardown: once torch (and DDP's
dynamo) is loaded, collecting every module at exit costs about 0.7 CPU-s per process, more than
hpcddp's whole start-up, paid by every rank of every job. Everything an exit promises still
happens first: other threads are joined and every exit handler runs (logs, trackers, loader
workers); only then are the standard streams flushed and the process ends with status 0.
A failure keeps the ordinary exit: a rank that only lost a peer must not end before srun has
heard of the rank that died, whose node the job script's policy reads from srun's first error
line; an exception main does not handle keeps its traceback.
"""

import atexit
import contextlib
import os
import sys

_status: list[int] = []


def _leave_without_teardown() -> None:
    """Registered before anything else, so it runs after every other exit handler."""
    if _status != [0]:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(_status[0])


atexit.register(_leave_without_teardown)

from hpcddp.cli import main  # noqa: E402  (after the handler: its exit handlers run first)

_status.append(main())
sys.exit(_status[0])
