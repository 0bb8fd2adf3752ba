"""How an ``hpcddp`` process leaves: a success or a Ctrl-C without the interpreter's teardown.

Once torch (and DDP's dynamo) is loaded, collecting every module at exit costs about 0.7 CPU-s
per process, more than hpcddp's whole start-up, paid by every rank of every job; and native
threads torn down while a peer leaves can abort the process (SIGABRT), a clean stop then read as
a crash. Everything an exit promises still happens first: other threads are joined and every
exit handler runs (logs, trackers, loader workers); only then are the standard streams flushed
and the process ends with main's status.
A failure keeps the ordinary exit: a rank that only lost a peer should not end before srun has
heard of the rank that died, whose node the job script's policy reads from srun's error lines
(passing over ranks that only lost a peer, exit status 76); an exception main does not handle
keeps its traceback. (A Ctrl-C reaches every rank: no rank's report has to come first.)

`register` must come before anything else registers an exit handler (exit handlers run last
registered, first run): ``python -m hpcddp`` calls it first thing, a local launch's zygote
before it loads torch (`hpcddp.cli.zygote`).
"""

import atexit
import contextlib
import os
import sys

from hpcddp import exit_codes

_LEAVE_FAST = (exit_codes.OK, exit_codes.INTERRUPTED)
_status: list[int] = []


def _leave_without_teardown() -> None:
    """Runs after every other exit handler (registered first)."""
    if len(_status) != 1 or _status[0] not in _LEAVE_FAST:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(_status[0])


def register() -> None:
    atexit.register(_leave_without_teardown)


def leave(status: int) -> None:
    """End the process with main's ``status`` (`SystemExit`: exit handlers run, then the leaving
    decided above)."""
    _status.append(status)
    sys.exit(status)
