"""What Slurm's controller says about jobs right now, from ``squeue`` and ``scontrol``.

Only the queue is asked, never ``sacct``: many clusters run without accounting, where
``sacct`` hangs or answers nothing (submitit#1720). The queue forgets a job ``MinJobAge``
seconds after it ends, so a job it no longer lists is reported as `LEFT_QUEUE` and the
caller decides from other evidence (`hpcddp.job_status`). The Slurm clients are run through
a ``run`` argument (``subprocess.run`` by default) so tests fake Slurm at that edge only.
"""

import re
import subprocess
from collections.abc import Callable, Iterable

from hpcddp.errors import HpcddpError

Runner = Callable[..., "subprocess.CompletedProcess[str]"]

# Slurm states in which a job may still produce output (everything else is an end state).
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "PREEMPTED",
        "RESV_DEL_HOLD",
    }
)
# The state of a job that Slurm no longer lists: it ended at least MinJobAge seconds ago.
LEFT_QUEUE = "LEFT_QUEUE"
# How long `hpcddp status` and `logs` wait for the controller: an unreachable one must not
# hang a command on the login node (Slurm's own clients retry for MessageTimeout and more).
ASK_TIMEOUT_S = 4.0


class SlurmUnreachable(HpcddpError):
    """The controller did not answer (down, unreachable, wrong SLURM_CONF, no Slurm here)."""


def _run(
    command: list[str], run: Runner | None, timeout_s: float = 30
) -> "subprocess.CompletedProcess[str] | None":
    """Run a Slurm client; None when it is missing or hangs (no controller, no config)."""
    try:
        return (run or subprocess.run)(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None


# -- squeue: the states of many jobs in one call ----------------------------------------------


def parse_squeue(text: str) -> dict[str, dict[str, str]]:
    """``squeue -h -o '%i|%T|%N|%r'`` lines -> {job id: {State, NodeList, Reason}}.

    Pending array tasks share one line (``12_[3-5%1]``); each task gets its own entry.
    """
    states = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            job_id, state, nodes, reason = parts
            for one in _expand_array(job_id):
                states[one] = {"State": state, "NodeList": nodes, "Reason": reason}
    return states


def _expand_array(job_id: str) -> list[str]:
    """``12_[3-5%1]`` -> ``12_3 12_4 12_5``; other ids unchanged."""
    match = re.fullmatch(r"(\d+)_\[([\d,-]+)(?:%\d+)?\]", job_id)
    if not match:
        return [job_id]
    ids = []
    for part in match[2].split(","):
        low, _, high = part.partition("-")
        ids += [f"{match[1]}_{i}" for i in range(int(low), int(high or low) + 1)]
    return ids


def query_states(job_ids: Iterable[str], run: Runner | None = None) -> dict[str, dict[str, str]]:
    """States of the given jobs and array tasks (``123``, ``123_4``) from one ``squeue`` call.

    A job Slurm no longer lists gets the state `LEFT_QUEUE`: it ended at least MinJobAge ago.
    When ``squeue`` cannot answer now (controller unreachable) the result is empty, so callers
    keep what they knew rather than mistaking silence for an end.
    """
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    arrays = sorted({job_id.split("_")[0] for job_id in ids})
    result = _run(["squeue", "-h", "-t", "all", "-j", ",".join(arrays), "-o", "%i|%T|%N|%r"], run)
    if result is None or (result.returncode != 0 and "Invalid job id" not in result.stderr):
        return {}
    states = parse_squeue(result.stdout if result.returncode == 0 else "")
    for job_id in ids:
        states.setdefault(job_id, {"State": LEFT_QUEUE, "NodeList": "", "Reason": ""})
    return states


# -- scontrol: everything about one job -------------------------------------------------------

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_scontrol(text: str) -> list[dict[str, str]]:
    """``scontrol show job -o`` output -> one dict per job record (array tasks are records)."""
    records = []
    for line in text.splitlines():
        keys = list(_KEY.finditer(line))
        if not keys:
            continue
        record = {}
        for match, following in zip(keys, [*keys[1:], None], strict=True):
            end = following.start() if following else len(line)
            record[match.group(1)] = line[match.end() : end].strip()
        records.append(record)
    return records


def scontrol_record(job_id: str, run: Runner | None = None) -> dict[str, str] | None:
    """Slurm's view of one job (``123`` or ``123_4``); None once it has forgotten the job.

    Raises `SlurmUnreachable` within `ASK_TIMEOUT_S` when the controller does not answer, so
    that a forgotten job and a silent controller are never mistaken for each other.
    """
    command = ["scontrol", "show", "job", "-o", job_id]
    result = _run(command, run, timeout_s=ASK_TIMEOUT_S)
    if result is None:
        raise SlurmUnreachable(
            f"`{' '.join(command)}` did not answer within {ASK_TIMEOUT_S:.0f} s (or scontrol is "
            "not installed here). HINT: check the controller with `scontrol ping` and SLURM_CONF."
        )
    if result.returncode != 0 and "Invalid job id" in result.stderr:
        return None
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise SlurmUnreachable(
            f"Slurm could not say anything about job {job_id}: {reason}. "
            "HINT: check the controller with `scontrol ping` and SLURM_CONF."
        )
    records = parse_scontrol(result.stdout)
    if "_" in job_id:  # a pending array may still be one record covering many tasks
        _array_id, index = job_id.split("_", 1)
        records = [r for r in records if _covers(r.get("ArrayTaskId", ""), int(index))] or records
    return records[0] if records else None


def _covers(task_ids: str, index: int) -> bool:
    """Does an ``ArrayTaskId`` such as ``3`` or ``0-7%2`` or ``1,4-5`` include ``index``?"""
    for part in task_ids.split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and int(low) <= index <= int(high if high.isdigit() else low):
            return True
    return False
