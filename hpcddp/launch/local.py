"""``hpcddp train --nproc N``: N processes on this host, numbered by us, failing together.

The processes are forked from one zygote that imported torch once (`hpcddp.launch.forked`).
The children find their place through ``HPCDDP_LOCAL_*`` variables (see
`hpcddp.launch.contexts.LocalContext`). If one child fails, the others are stopped soon after
rather than left waiting in a collective until its timeout. The children report what ended
them (`hpcddp.launch.error_reports`) instead of printing it, and the launcher prints each distinct
cause once. If the launcher itself dies, even by ``kill -9``, the kernel ends the zygote and
tells every child (``PR_SET_PDEATHSIG``): it stops cleanly, and `watch_launcher` ends it if it
cannot.
"""

import logging
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

from hpcddp import exit_codes
from hpcddp.launch import deaths, error_reports, forked, leftovers
from hpcddp.launch.ports import PORT_BASE, PORT_SPAN

log = logging.getLogger(__name__)

# Variables of an outer launcher that would make a child mistake its own place in the job.
_FOREIGN = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SUBMITIT_LOCAL_GLOBALID",
)


def free_port(tries: int = 64) -> int:
    """A port free now, below the kernel's ephemeral range (`hpcddp.launch.ports`).

    Between this check and rank 0's bind the port is nobody's: one from the ephemeral range
    (what binding port 0 gives) can meanwhile go to any outgoing connection on the host, which
    happened under load; below that range only another listener picking the same port could
    take it."""
    for _ in range(tries):
        port = random.randrange(PORT_BASE, PORT_BASE + PORT_SPAN)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use: try another
            return port
    with socket.socket() as sock:  # that whole range busy: let the kernel choose
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


ORPHAN_GRACE_S = 5.0  # a clean stop takes a step and a save; then the rank is ended anyway


def watch_launcher(environ: Mapping[str, str], grace_s: float = ORPHAN_GRACE_S) -> None:
    """In a local rank: once the launcher is gone, give the clean stop ``grace_s``, then end.

    The launcher's zygote, the rank's parent, dies with the launcher; the SIGTERM that then
    comes (`hpcddp.launch.forked.die_with`) only sets the stop flag, and a rank waiting in a
    collective for a peer would wait for ``dist.timeout_s``. Nothing happens outside a local
    launch.
    """
    launcher = environ.get("HPCDDP_LOCAL_JOB_ID", "")
    if not launcher.isdigit() or leftovers.ancestor_pids()[1:2] != [int(launcher)]:
        return
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="hpcddp-launcher-watch", daemon=True).start()


def child_env(
    rank: int,
    nproc: int,
    port: int,
    base: Mapping[str, str],
    report_dir: pathlib.Path | None = None,
) -> dict[str, str]:
    """The environment of local rank ``rank`` of ``nproc``."""
    env = {k: v for k, v in base.items() if k not in _FOREIGN}
    env.update(
        HPCDDP_LOCAL_RANK=str(rank),
        HPCDDP_LOCAL_WORLD_SIZE=str(nproc),
        HPCDDP_LOCAL_JOB_ID=str(os.getpid()),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    if report_dir is not None:
        env[error_reports.REPORT_FILE_VAR] = str(report_dir / f"rank-{rank}.json")
    return env


def launch(argv: Sequence[str], nproc: int) -> int:
    """Run ``python -m hpcddp <argv>`` in ``nproc`` processes; return the job's exit code."""
    port = int(os.environ.get("MASTER_PORT") or free_port())
    with tempfile.TemporaryDirectory(prefix="hpcddp-reports-") as folder:
        report_dir = pathlib.Path(folder)
        envs = [child_env(r, nproc, port, os.environ, report_dir) for r in range(nproc)]
        children = forked.start(argv, envs)
        # Ctrl-C already reaches the children (same process group); forward only what does not.
        previous = {
            s: signal.signal(s, lambda n, f: _forward(children, n))
            for s in (signal.SIGTERM, signal.SIGUSR2)
        }
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, lambda n, f: None)
        try:
            failed = _wait(children)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return _outcome(failed, error_reports.read_all(sorted(report_dir.glob("rank-*.json"))))


def _outcome(failed: tuple[int, int] | None, found: list[error_reports.Report]) -> int:
    """Print what ended the run, once; return the job's exit status."""
    if failed is None:
        return 0
    rank, status = failed
    sig = deaths.signal_of(status)
    if sig is not None and all(r.secondary for r in found):  # the others only lost it
        print(f"hpcddp: error: {deaths.death_line(rank, sig)}", file=sys.stderr, flush=True)
        return deaths.exit_status(sig)
    lines, code = error_reports.summarize(found)
    if not lines or code is None:  # no rank said why (killed, or it printed its traceback)
        code = status if sig is None else deaths.exit_status(sig)
        lines = [f"hpcddp: local rank {rank} exited with code {code}; the others were stopped"]
    print("\n".join(lines), file=sys.stderr, flush=True)
    return code


def _forward(children: list[forked.ForkedRank], signum: int) -> None:
    """Pass Ctrl-C / SIGTERM on to every child so they can stop cleanly."""
    for child in children:
        child.send_signal(signum)  # only to a child still running


def _wait(
    children: list[forked.ForkedRank], settle_s: float = 2.0, grace_s: float = 10.0
) -> tuple[int, int] | None:
    """Wait for all; on the first failure stop the rest; (rank, returncode) of that failure
    (``-signum`` for a rank a signal killed).

    The others get ``settle_s`` to end on their own first: a refusal every rank reaches ends
    them all within moments, and each then reports it rather than being cut off mid-sentence.
    """
    while True:
        codes = [c.poll() for c in children]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            _settle(children, settle_s)
            cause = _cause(failed[0], children)
            _stop(children, grace_s)
            return cause
        if all(c == 0 for c in codes):
            return None
        time.sleep(0.05)


def _cause(first: tuple[int, int], children: list[forked.ForkedRank]) -> tuple[int, int]:
    """(rank, returncode) of the failure that caused the others: the first one seen, unless
    that rank only lost a peer (`exit_codes.PEER_LOST`): it can end before the rank that died."""
    if first[1] != exit_codes.PEER_LOST:
        return first
    ended = [(r, c.returncode) for r, c in enumerate(children) if c.returncode not in (None, 0)]
    causes = [(rank, code) for rank, code in ended if code != exit_codes.PEER_LOST]
    return causes[0] if causes else first


def _settle(children: list[forked.ForkedRank], settle_s: float) -> None:
    """Give the survivors a moment to exit by themselves."""
    deadline = time.monotonic() + settle_s
    while any(c.poll() is None for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)


def _stop(children: list[forked.ForkedRank], grace_s: float) -> None:
    """SIGTERM the survivors, then SIGKILL whoever is still there after ``grace_s``."""
    _forward(children, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
