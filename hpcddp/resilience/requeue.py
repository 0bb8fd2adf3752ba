"""Putting this Slurm job back in the queue from inside it (``scontrol requeue``).

An executor: rank 0 calls it when `hpcddp.resilience.rules.after_stop` decided a requeue, and
decides nothing itself. A requeued job keeps its id and reruns its batch script, which
resumes from the checkpoint. Inside a container there is often no ``scontrol``; the rank then
says why and the job script, which runs outside the container, requeues instead (exit status
75, see `hpcddp.exit_codes`).
"""

import os
import shutil
import subprocess
from collections.abc import Mapping


def own_job_id(environ: Mapping[str, str]) -> str:
    """This job's id as scontrol names it: ``ARRAY_TASK`` form for an array task."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return environ.get("SLURM_JOB_ID", "")


def requeue(environ: Mapping[str, str] = os.environ) -> tuple[bool, str]:
    """Ask Slurm to requeue this job; (ok, what happened) for the log and the exit code."""
    job_id = own_job_id(environ)
    if not job_id:
        return False, "not a Slurm job, nothing to requeue"
    if shutil.which("scontrol") is None:
        return False, "scontrol is not on PATH here (container without Slurm tools?)"
    try:
        result = subprocess.run(
            ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60
        )
    except (subprocess.SubprocessError, OSError) as err:
        return False, f"scontrol requeue {job_id} failed: {err}"
    if result.returncode != 0:
        return False, f"scontrol requeue {job_id} failed: {result.stderr.strip()}"
    return True, f"job {job_id} requeued"
