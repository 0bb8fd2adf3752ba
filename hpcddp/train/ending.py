"""The end of a run: every rank's weights checked equal and summary.json written, or a
non-finite stop explained the same way on every rank.

Both end in `hpcddp.train.summary.write_summary` (rank 0), in the one shape it defines.
"""

import logging
import pathlib
import time

from hpcddp.comm import collectives
from hpcddp.errors import DistributedError, NonFiniteError
from hpcddp.launch.distenv import DistEnv
from hpcddp.outcome import RunOutcome
from hpcddp.storage import attempts
from hpcddp.train import ddp, guard
from hpcddp.train.assembly import Parts
from hpcddp.train.state import Progress, weights_sha256
from hpcddp.train.stopping import Stopping
from hpcddp.train.summary import FILE, RunSummary, write_summary
from hpcddp.train.timeline import Timeline, summarise, table

log = logging.getLogger(__name__)


def finish(
    parts: Parts,
    env: DistEnv,
    progress: Progress,
    stopping: Stopping,
    timeline: Timeline,
    train_ended: float,
    evaluated: dict[str, float] | None,
) -> RunOutcome:
    """Check every rank holds the same weights, then write summary.json (rank 0)."""
    run_dir = parts.checkpoints.run_dir
    ddp.sync_buffers(parts.model)
    digest = weights_sha256(parts.model)
    timeline.add("teardown", time.perf_counter() - train_ended)
    gathered = collectives.all_gather_object((digest, env.hostname, timeline.seconds))
    digests, hosts = [d for d, _, _ in gathered], [h for _, h, _ in gathered]
    if len(set(digests)) > 1:
        bad = [r for r, d in enumerate(digests) if d != digests[0]]
        raise DistributedError(
            f"model weights differ across ranks (ranks {bad} disagree "
            "with rank 0): DDP replicas diverged."
        )
    spent = summarise([seconds for _, _, seconds in gathered], hosts)
    summary = RunSummary.of("finished", env, hosts, progress, weights_sha256=digest,
                            timeline=spent, evaluation=evaluated or {})  # fmt: skip
    # a re-run of a finished run trains nothing and changes nothing (its timeline included)
    rerun = progress.step == stopping.resumed_step and (run_dir / FILE).exists()
    if env.is_main and not rerun:
        stopping.record_attempt("finished", progress.step)
        summary.attempts = attempts.history(run_dir)
        write_summary(run_dir, summary)
    parts.reports.ending = "finished"  # the trackers close the run as finished
    if env.is_main:
        log.info("finished: %d steps, final loss %.4f, weights %s",
                 progress.step, progress.last_loss, digest[:12])  # fmt: skip
        log.info("where the time went (seconds per rank):\n%s", table(spent))
    return RunOutcome(step=progress.step, summary=summary.as_dict())


def refuse_nonfinite(
    parts: Parts, env: DistEnv, progress: Progress, policy: str, run_dir: pathlib.Path
) -> None:
    """After a non-finite stop: summary.json says why (rank 0), then every rank raises."""
    stopped = parts.guard.stopped
    step = stopped.step if stopped else progress.step
    seen = collectives.all_gather_object(bool(stopped and stopped.own_loss))
    ranks = [r for r, bad in enumerate(seen) if bad]
    latest = parts.checkpoints.store.latest_step()
    text = guard.message(step, ranks, progress.skipped_steps, latest, policy,
                         parts.guard.collapsed_scale)  # fmt: skip
    if env.is_main:
        summary = RunSummary.of("failed", env, parts.hosts, progress, reason="nonfinite",
                                first_rank=ranks[0] if ranks else None,
                                latest_checkpoint=latest, message=text)  # fmt: skip
        summary.steps = step
        write_summary(run_dir, summary)
    parts.reports.ending = "failed"  # the trackers close the run as failed
    raise NonFiniteError(text)
