"""When this Slurm job must end, read so that no user setting or leftover can fool it.

Three sources, most trusted first:

1. ``squeue -j $SLURM_JOB_ID -o %e``: this job's own end, kept current by Slurm (a time limit
   changed with ``scontrol update`` included). squeue prints times in the user's
   ``SLURM_TIME_FORMAT`` (``relative`` gives "12:07:20", a strftime format anything at all),
   so it is asked for ``standard`` explicitly;
2. ``HPCDDP_JOB_END_TIME=<job id>@<epoch>``, which hpcddp's job script exports for ranks that
   cannot call squeue (inside a container): used only when the job id is this job's;
3. ``SLURM_JOB_END_TIME`` (newer Slurm sets it; an outer allocation's may leak into a job
   submitted from inside it): used only when it is still in the future, so a stale one can
   never stop a job at once, again and again.

`check_time_fits` refuses a job whose time cannot hold the stop margin: it would stop before
its first step and requeue forever.
"""

import datetime
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping

from hpcddp.errors import ConfigError

JOB_END_VAR = "HPCDDP_JOB_END_TIME"
# What squeue prints instead of a time: no limit, or not known yet.
_NO_TIME = {"", "N/A", "NONE", "UNKNOWN", "INVALID", "UNLIMITED"}
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def parse_time(text: str) -> float | None:
    """Epoch seconds from squeue's ``standard`` format (ISO, local time) or plain epoch digits."""
    text = text.strip()
    if text.upper() in _NO_TIME:
        return None
    if text.isdigit():
        return float(text)
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _from_squeue(job_id: str, environ: Mapping[str, str], run: Runner) -> float | None:
    if not job_id or shutil.which("squeue", path=environ.get("PATH")) is None:
        return None
    env = {**environ, "SLURM_TIME_FORMAT": "standard"}
    try:
        done = run(
            ["squeue", "-h", "-j", job_id, "-o", "%e"],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines() if done.returncode == 0 else []
    return parse_time(lines[0]) if lines else None


def _from_job_script(job_id: str, environ: Mapping[str, str]) -> float | None:
    owner, _, end = environ.get(JOB_END_VAR, "").partition("@")
    return parse_time(end) if job_id and owner == job_id else None


def job_end_time(
    environ: Mapping[str, str],
    run: Runner = subprocess.run,
    now: Callable[[], float] = time.time,
) -> float | None:
    """This job's end (epoch seconds); None when it has no limit or it cannot be known."""
    job_id = environ.get("SLURM_JOB_ID", "")
    found = _from_squeue(job_id, environ, run)
    if found is None:
        found = _from_job_script(job_id, environ)
    if found is None:
        leaked = parse_time(environ.get("SLURM_JOB_END_TIME", ""))
        found = leaked if leaked is not None and leaked > now() else None
    return found


def check_time_fits(end: float | None, margin_s: float, now: float) -> None:
    """Refuse a job that would stop for its time limit before its first step, every time."""
    if end is None or end - now > margin_s:
        return
    left = max(end - now, 0.0)
    raise ConfigError(
        f"the job ends in {left:.0f} s, within train.stop_before_end_s={margin_s:.0f} s of its "
        "time limit: it would stop and requeue before its first step, again and again. HINT: "
        f"ask for more time (--time, slurm.time_min), or lower train.stop_before_end_s (and "
        f"slurm.signal_delay_s) well below {left:.0f} s."
    )
