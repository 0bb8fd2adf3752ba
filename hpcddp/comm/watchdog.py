"""The hang watchdog: one thread per rank that reads the step counter and acts on a stall.

The thread reads `hpcddp.comm.hang.Beat` (the loop writes its step there) every tick; no
collective, no lock, nothing per step. When the step stands still past its budget, the rank
writes its stacks (`hpcddp.comm.stacks`) and reports to the others through the job's store: a
connection of its own to the rendezvous store, never the process group, which the waiting
ranks block. The first rank to report decides once every rank has (or the grace ran out),
names the ranks that are behind (`hpcddp.comm.hang.behind`) and writes the verdict to the
store and to ``verdict.json`` beside the stacks. The hung ranks then end their process with
`hpcddp.exit_codes.HUNG`, a rank death: ``srun --kill-on-bad-exit`` ends the step, and the job
script requeues the job without the node (`hpcddp.slurm.retry`).
"""

import dataclasses
import datetime
import json
import logging
import os
import pathlib
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch.distributed as dist

from hpcddp import exit_codes, run_files
from hpcddp.comm import hang
from hpcddp.comm.stacks import dump_stacks
from hpcddp.launch import error_reports
from hpcddp.launch.distenv import DistEnv
from hpcddp.storage.atomic import atomic_write_text

log = logging.getLogger(__name__)
# `hpcddp.train.logs.FILE_ONLY` (a layer above): for the rank's log, not the console, which
# gets the verdict's one line.
_FILE_ONLY = {"hpcddp_file_only": True}

VERDICT = run_files.HANG_VERDICT


def _ended(status: int) -> None:
    """End this process at once: its main thread is stuck and cannot be asked to."""
    logging.shutdown()  # flush every rank log first
    sys.stderr.flush()
    os._exit(status)


@dataclasses.dataclass(frozen=True)
class Place:
    """Where this rank writes and who it is: what a verdict needs beyond the reports."""

    rank: int
    world_size: int
    host: str
    stacks_dir: pathlib.Path
    main_thread: int | None = None  # whose stack says where the rank is; None: the main one


class Watchdog:
    """Watch ``beat`` from a daemon thread; on a stall, dump, report, decide, end the hung."""

    def __init__(
        self,
        beat: hang.Beat,
        budget: hang.Budget,
        place: Place,
        store: dist.Store,
        *,
        clock: Callable[[], float] = time.monotonic,
        end: Callable[[int], None] = _ended,
    ) -> None:
        self.beat, self.budget, self.place, self.store = beat, budget, place, store
        self.clock, self.end = clock, end
        self.main_thread = place.main_thread or threading.main_thread().ident
        self.tick_s = min(max(budget.steady_s / 20, 0.05), 1.0)
        self.grace_s = min(max(budget.steady_s, 5.0), 30.0)  # for the other ranks' reports
        self.timer = hang.StallTimer(budget, beat.step, clock())
        self.stopped = threading.Event()
        self.verdict: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._watch, name="hpcddp-hang-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        """Begin watching (the thread is a daemon: it never keeps a finished process alive)."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; returns at once, the thread ends at its next tick."""
        self.stopped.set()

    def _watch(self) -> None:
        # where this rank runs, for a verdict on a rank too stuck to report (one store call)
        self.store.set(f"host/{self.place.rank}", self.place.host)
        while not self.stopped.wait(self.tick_s):
            stalled = self.timer.stalled_s(self.beat.step, self.beat.phase, self.clock())
            if stalled is not None and not self.stopped.is_set():
                try:
                    self.on_stall(stalled)
                except Exception as err:  # the store gone: the job is ending anyway
                    log.warning("hang watchdog: could not agree on a verdict: %s", err)
                return
        try:  # training ended here: a rank still stepping is not waiting for this one
            self.store.set(f"done/{self.place.rank}", str(self.beat.step))
        except Exception:  # the store may be gone with rank 0 at the very end: nothing to tell
            log.debug("could not tell the store training ended", exc_info=True)

    def on_stall(self, stalled_s: float) -> None:
        """Dump, report, let the first reporter decide, then act on the verdict."""
        report = self._report(stalled_s)
        self.store.set(f"report/{report.rank}", json.dumps(dataclasses.asdict(report)))
        if self.store.add("claim", 1) == 1:
            self._decide()
        self.verdict = json.loads(self.store.get("verdict"))
        self._act(self.verdict)

    def _report(self, stalled_s: float) -> hang.Report:
        p = self.place
        frame = sys._current_frames().get(self.main_thread or 0)
        header = (
            f"rank {p.rank}/{p.world_size} on {p.host}: no progress for {stalled_s:.0f} s "
            f"after step {self.beat.step} ({self.beat.phase})"
        )
        tool = dump_stacks(p.stacks_dir / f"rank-{p.rank}.txt", header)
        log.warning("%s; stacks (by %s) in %s", header, tool, p.stacks_dir, extra=_FILE_ONLY)
        return hang.Report(
            rank=p.rank,
            host=p.host,
            step=self.beat.step,
            phase=self.beat.phase,
            waiting=hang.waiting_in_collective(frame),
            where=hang.innermost(frame),
            stalled_s=round(stalled_s, 1),
        )

    def _decide(self) -> None:
        """The first reporter: wait for every report (or the grace), name the hung, publish."""
        world = range(self.place.world_size)
        deadline = self.clock() + self.grace_s
        while self.clock() < deadline:
            if all(self._has(f"report/{r}") or self._has(f"done/{r}") for r in world):
                break
            time.sleep(0.05)
        reports = {
            rank: hang.Report(**json.loads(self.store.get(f"report/{rank}")))
            for rank in world
            if self._has(f"report/{rank}")
        }
        done = [rank for rank in world if rank not in reports and self._has(f"done/{rank}")]
        ranks = hang.behind(reports, self.place.world_size, done)
        hung = [reports[r] for r in ranks if r in reports]
        silent = [r for r in ranks if r not in reports]
        silent_hosts = [
            self.store.get(f"host/{r}").decode() for r in silent if self._has(f"host/{r}")
        ]
        verdict = {
            "ranks": ranks,
            "hosts": sorted({*(r.host for r in hung), *silent_hosts}),
            "silent": silent,
            "reports": [dataclasses.asdict(r) for r in reports.values()],
            "detected": round(time.time(), 3),
            "decided_by": self.place.rank,
            "message": hang.message(hung, silent, self.budget.steady_s, str(self.place.stacks_dir)),
        }
        text = json.dumps(verdict, indent=2) + "\n"
        atomic_write_text(self.place.stacks_dir / VERDICT, text)
        self.store.set("verdict", text)

    def _has(self, key: str) -> bool:
        return self.store.check([key])

    def _act(self, verdict: dict[str, Any]) -> None:
        """A hung rank ends as a rank death; the others keep waiting until the step ends."""
        rank, ranks = self.place.rank, verdict["ranks"]
        # A silent rank cannot end itself: the decider ends instead, and the job script takes
        # the node to exclude from the verdict, not from the rank that exited.
        ending = rank in ranks or (verdict["silent"] and rank == verdict["decided_by"])
        first = rank == min(ranks) or (rank == verdict["decided_by"] and verdict["silent"])
        report_file = os.environ.get(error_reports.REPORT_FILE_VAR)
        if first and report_file:  # `hpcddp train --nproc`: its launcher prints it, once
            found = error_reports.Report(rank, self.place.host, exit_codes.HUNG, verdict["message"])
            error_reports.write(report_file, found)
        console = first and not report_file
        level, extra = (logging.ERROR, None) if console else (logging.WARNING, _FILE_ONLY)
        log.log(level, "%s", verdict["message"], extra=extra)
        if ending:
            self.end(exit_codes.HUNG)


def store_for_watchdog(
    env: DistEnv, timeout_s: float, restart: int, environ: Mapping[str, str] = os.environ
) -> dist.Store:
    """A connection of the watchdog's own to the job's store (an in-memory one for one rank).

    Its own, because a store client serializes its calls: the training thread may sit in a
    store wait of its own while the watchdog must still talk. Its keys are the attempt's: a
    requeue (``restart``) or a torchrun restart (which keeps its agent's store) starts afresh.
    """
    if env.world_size == 1:
        return dist.HashStore()
    store = dist.TCPStore(
        env.master_addr,
        env.master_port,
        None,
        False,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    elastic = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"hpcddp/hang/{restart}.{elastic}", store)


def watching(
    beat: hang.Beat,
    hang_timeout_s: float,
    hang_slow_phase_s: float,
    env: DistEnv,
    stacks_dir: pathlib.Path,
    restart: int = 0,
) -> Watchdog | None:
    """Start the watchdog the config asks for (None when ``dist.hang_timeout_s`` is 0)."""
    if hang_timeout_s <= 0:
        return None
    budget = hang.Budget.from_config(hang_timeout_s, hang_slow_phase_s)
    place = Place(env.rank, env.world_size, env.hostname, stacks_dir)
    store = store_for_watchdog(env, budget.slow_s + 120, restart)
    return Watchdog(beat, budget, place, store).start()
