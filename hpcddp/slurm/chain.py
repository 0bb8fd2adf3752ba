"""Job chains (``slurm.chain=N``): a run longer than the time limit, as N jobs one after another.

The links are N submissions of one job under one job name with ``--dependency=singleton``:
Slurm starts a link once no earlier job of that name and user runs or waits, whatever state
it ended in (``afterok`` would never fire after a TIMEOUT). The name is the job name plus a
digest of the absolute run directory, so two runs never wait on each other, and two chains
submitted into one run directory never run at once.

Which mechanism carries on: a link stopped by its time limit checkpoints and ends with status
0; it never requeues itself (`hpcddp.train.stopping`), since a requeued job would queue again
ahead of the next link. A rank's death is still retried within the link by the job script's
policy (`hpcddp.slurm.policy`), as without a chain.

Once the run has ended for good (completed, or stopped by the policy for a failure a retry
cannot fix; the rule is `hpcddp.resilience.rules.why_cancel`), the links left are cancelled
by job id: by the batch shell of the link that ended
(`rest_to_cancel` names them to `hpcddp.slurm.policy`), because that shell runs outside any
container, where ``scancel`` is, after every rank has exited (no rank is cut short), and it
sees the endings no rank lives to report (bad input on every rank, a death). Under ``hpcddp
submit`` (submitit: no batch shell of ours) task 0 does it as it returns. A link that starts
after the run ended leaves at once (`ended_before`), before any rank starts.
"""

import dataclasses
import hashlib
import logging
import os
import pathlib
import subprocess
import time
from collections.abc import Callable

from hpcddp.config import SlurmConfig
from hpcddp.records import attempts, chain_record
from hpcddp.records.chain_record import ChainRecord
from hpcddp.resilience.rules import LinkEnd, why_cancel
from hpcddp.slurm import run_end

log = logging.getLogger(__name__)

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def chain_name(job_name: str, run_dir: str | os.PathLike[str]) -> str:
    """``hpcddp-3f2a9c1e``: the job name and a digest of the run directory's absolute path."""
    where = str(pathlib.Path(run_dir).absolute())
    return f"{job_name}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


def chained(slurm: SlurmConfig, run_dir: str | os.PathLike[str]) -> SlurmConfig:
    """The slurm section with the chain's job name (unchanged without a chain)."""
    if not slurm.chained:
        return slurm
    return dataclasses.replace(slurm, job_name=chain_name(slurm.job_name, run_dir))


def submit_links(
    submit_one: Callable[[int], str], run_dir: str | os.PathLike[str], name: str, size: int
) -> ChainRecord:
    """Submit ``size`` links with ``submit_one(link)`` (it returns the job id), recording each.

    The record is written before the first link, so that no link can start unrecorded.
    """
    os.makedirs(run_dir, exist_ok=True)
    record = ChainRecord(name=name, size=size, submitted_at=time.time())
    chain_record.save(run_dir, record)
    for link in range(1, size + 1):
        record = dataclasses.replace(record, links=(*record.links, submit_one(link)))
        chain_record.save(run_dir, record)
    return record


# -- how a link ended, and what that leaves to the rest ---------------------------------------


def run_ended(run_dir: str | os.PathLike[str], since: float) -> str:
    """ "completed", "failed (why)" or "": what a summary.json written since ``since`` says."""
    end = run_end.read(run_dir, since)
    if end is None or end.damaged:
        return ""
    return f"failed ({end.reason})" if end.failed else "completed"


def rest_to_cancel(
    run_dir: str | os.PathLike[str], job_id: str, status: int, *, terminated: bool
) -> tuple[tuple[str, ...], str]:
    """The links after ``job_id`` to cancel now, and why; () when the chain carries on."""
    found = chain_record.link_of(run_dir, job_id)
    if found is None:
        return (), ""
    chain, _ = found
    mine = [r for r in attempts.records(run_dir) if r.get("job") == job_id]
    end = LinkEnd(
        status=status,
        terminated=terminated,
        ended=run_ended(run_dir, chain.submitted_at),
        cause=str(mine[-1].get("cause", "")) if mine else "",
    )
    why = why_cancel(end)
    return (chain.after(job_id), why) if why else ((), "")


def ended_before(run_dir: str | os.PathLike[str], job_id: str) -> tuple[tuple[str, ...], str]:
    """At a link's start: the links left to cancel, and why, when the run already ended."""
    found = chain_record.link_of(run_dir, job_id)
    if found is None:
        return (), ""
    chain, where = found
    ended = run_ended(run_dir, chain.submitted_at)
    if not ended:
        return (), ""
    return chain.after(job_id), f"the run {ended} before link {where} started"


def cancel(jobs: tuple[str, ...], run: Runner = subprocess.run) -> str:
    """``scancel`` the jobs; what happened, for the log."""
    if not jobs:
        return ""
    try:
        done = run(["scancel", *jobs], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return f"could not cancel the chain's links {','.join(jobs)}: {err}"
    if done.returncode != 0:
        return f"scancel {' '.join(jobs)} failed: {done.stderr.strip()}"
    return f"cancelled the chain's links left: {','.join(jobs)}"
