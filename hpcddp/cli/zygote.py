"""The zygote of a local launch: torch loaded once, each rank forked from it.

Every rank of ``hpcddp train --nproc N`` used to load torch itself: about 3 CPU-s each (torch,
then the dynamo that DDP's constructor loads), N times over, more than a short run's whole
training. The launcher (`hpcddp.launch.local`) starts this process instead: it loads what
every rank loads, then forks one child per rank, and each child becomes exactly
``python -m hpcddp ARGV`` in its own environment, with torch already there.
Nothing of a rank's own runs before the fork (no config read, no thread, no CUDA), so each
child starts as a fresh interpreter would, only later in its life.

The zygote is the ranks' parent: it tells the launcher each rank's pid, then each rank's exit
status (as `subprocess.Popen.returncode` gives it), one JSON line each. It ignores the signals
meant for the ranks (a Ctrl-C reaches the whole process group), and ends with the launcher:
the kernel kills it (``PR_SET_PDEATHSIG``), which tells each rank in turn.

``python -m hpcddp.cli.zygote JOBS_FD EVENTS_FD``: one job per line on JOBS_FD (``argv``,
``env``), read to its end before any fork; the ranks work in the launcher's directory.
"""

import contextlib
import gc
import importlib
import json
import os
import signal
import sys
import warnings
from typing import Any

from hpcddp import leaving

# What every rank loads before its first step: torch, the dynamo that DDP's constructor loads,
# and hpcddp's trainer. A module that fails to load here is loaded (and fails) in the rank.
PRELOAD = ("torch", "torch._dynamo", "hpcddp.train.trainer")
# Meant for the ranks (the launcher forwards them, or a Ctrl-C reaches the process group).
_RANKS_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2, signal.SIGHUP)


def serve(jobs_fd: int, events_fd: int) -> dict[str, Any]:
    """Fork one rank per job; in each child, return its job. The zygote itself never returns:
    it reports and reaps its ranks, then exits."""
    from hpcddp.launch.forked import die_with  # after `leaving.register` (logging's exit handler)

    dispositions = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _RANKS_SIGNALS}
    for name in PRELOAD:
        with contextlib.suppress(Exception):  # the rank loads it again, and says why it fails
            importlib.import_module(name)
    gc.freeze()  # what was loaded stays shared, and no rank's collection walks it again
    with os.fdopen(jobs_fd) as jobs_file:
        jobs = [json.loads(line) for line in jobs_file]
    events = os.fdopen(events_fd, "w", buffering=1)
    ranks: dict[int, int] = {}
    zygote = os.getpid()
    for rank, job in enumerate(jobs):
        with warnings.catch_warnings():  # Python >= 3.12 warns of any thread, here numpy's
            # idle BLAS pool, which re-forms itself in the child (as in every DataLoader worker)
            warnings.filterwarnings(
                "ignore", "This process .* is multi-threaded", DeprecationWarning
            )
            pid = os.fork()
        if pid == 0:
            die_with(zygote, signal.SIGTERM)  # a clean stop when the launcher (so the zygote) dies
            events.close()
            for sig, disposition in dispositions.items():
                signal.signal(sig, disposition)
            return job
        ranks[pid] = rank
        print(json.dumps({"rank": rank, "pid": pid}), file=events)
    while ranks:
        pid, status = os.wait()
        if pid in ranks:
            code = os.waitstatus_to_exitcode(status)
            print(json.dumps({"rank": ranks.pop(pid), "code": code}), file=events)
    os._exit(0)


def become(job: dict[str, Any]) -> None:
    """Turn this forked child into ``python -m hpcddp`` with the job's arguments."""
    os.environ.clear()
    os.environ.update(job["env"])
    sys.argv = [sys.argv[0], *job["argv"]]
    from hpcddp.cli.main import main

    leaving.leave(main(job["argv"]))


if __name__ == "__main__":
    leaving.register()  # before the preload registers exit handlers: it must run after them
    become(serve(int(sys.argv[1]), int(sys.argv[2])))
