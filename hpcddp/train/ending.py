"""The end of a run: every rank's weights checked equal and summary.json written, or a
non-finite stop explained the same way on every rank.

Both end in `hpcddp.train.summary.write_summary` (rank 0), in the one shape
`hpcddp.run_files.RunSummary` defines.
"""

import logging
import pathlib

import torch

from hpcddp.comm import collectives
from hpcddp.errors import DistributedError, NonFiniteError
from hpcddp.launch.distenv import DistEnv
from hpcddp.outcome import RunOutcome
from hpcddp.records import attempts
from hpcddp.run_files import FAILED, FINISHED, summary_path
from hpcddp.train import ddp, guard
from hpcddp.train.state import Progress, weights_sha256
from hpcddp.train.stopping import Stopping
from hpcddp.train.summary import summary_of, write_summary
from hpcddp.train.timeline import Timeline, summarise, table

log = logging.getLogger(__name__)


def finish(
    model: torch.nn.Module,
    env: DistEnv,
    progress: Progress,
    stopping: Stopping,
    timeline: Timeline,
    evaluated: dict[str, float] | None,
) -> RunOutcome:
    """Check every rank holds the same weights (``model``, unwrapped), then write summary.json
    (rank 0)."""
    run_dir = stopping.run_dir
    ddp.sync_buffers(model)
    digest = weights_sha256(model)
    timeline.wound_down()
    gathered = collectives.all_gather_object((digest, env.hostname, timeline.seconds))
    digests, hosts = [d for d, _, _ in gathered], [h for _, h, _ in gathered]
    if len(set(digests)) > 1:
        bad = [r for r, d in enumerate(digests) if d != digests[0]]
        raise DistributedError(
            f"model weights differ across ranks (ranks {bad} disagree "
            "with rank 0): DDP replicas diverged."
        )
    spent = summarise([seconds for _, _, seconds in gathered], hosts)
    summary = summary_of(FINISHED, env, hosts, progress, weights_sha256=digest, timeline=spent)
    summary.evaluation = evaluated or {}
    # a re-run of a finished run trains nothing and changes nothing (its timeline included)
    rerun = progress.step == stopping.resumed_step and summary_path(run_dir).exists()
    if env.is_main and not rerun:
        stopping.record_attempt("finished", progress.step)
        summary.attempts = attempts.history(run_dir)
        write_summary(run_dir, summary)
    if env.is_main:
        loss, short = progress.last_loss, digest[:12]
        log.info("finished: %d steps, final loss %.4f, weights %s", progress.step, loss, short)
        log.info("where the time went (seconds per rank):\n%s", table(spent))
    return RunOutcome(step=progress.step, summary=summary)


def refuse_nonfinite(
    nan_guard: guard.Guard,
    latest: int | None,
    hosts: list[str],
    env: DistEnv,
    progress: Progress,
    run_dir: pathlib.Path,
) -> None:
    """After a non-finite stop: summary.json says why (rank 0), then every rank raises.

    ``latest``: the step of the latest complete checkpoint; ``hosts``: every rank's, in order.
    """
    stopped = nan_guard.stopped
    step = stopped.step if stopped else progress.step
    seen = collectives.all_gather_object(bool(stopped and stopped.own_loss))
    ranks = [r for r, bad in enumerate(seen) if bad]
    skipped, scale = progress.skipped_steps, nan_guard.collapsed_scale
    text = guard.message(step, ranks, skipped, latest, nan_guard.policy, scale)
    if env.is_main:
        summary = summary_of(FAILED, env, hosts, progress, reason="nonfinite", message=text)
        summary.first_rank = ranks[0] if ranks else None
        summary.latest_checkpoint, summary.steps = latest, step
        write_summary(run_dir, summary)
    raise NonFiniteError(text)
