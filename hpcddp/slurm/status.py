"""Where a submitted job stands: its state, and which files hold its output.

The state comes from Slurm while Slurm remembers the job (`hpcddp.slurm.queue`), and from the
job index (`hpcddp.slurm.index`) and the run's own files afterwards. A job is only ever called
COMPLETED when its run directory holds a summary written after it was submitted: a
batch script can exit 0 after the training failed (a failed job reported as COMPLETED is
hydra#1928).
"""

import dataclasses
import pathlib
import pickle
from typing import Any

from hpcddp.errors import ConfigError
from hpcddp.outcome import RunOutcome
from hpcddp.records import attempts
from hpcddp.run_files import SUMMARY, rank_log, summary_path
from hpcddp.slurm import run_end
from hpcddp.slurm.index import JobRecord, find_records, jobs_dir
from hpcddp.slurm.queue import LEFT_QUEUE, Runner, SlurmUnreachable, scontrol_record

# -- the outcome ------------------------------------------------------------------------------


def file_outcome(record: JobRecord) -> str | None:
    """What the run's own files say: COMPLETED, STOPPED, FAILED, or None (nothing yet)."""
    result = read_result(record.result_pickle())
    if result is not None and result[0] == "error":
        return "FAILED"
    if result is not None and isinstance(result[1], RunOutcome) and not result[1].finished:
        return "STOPPED"
    end = run_end.read(record.run_dir, since=record.submitted_at)
    if end is None:
        return None
    if end.damaged:
        return f"UNKNOWN ({SUMMARY} is damaged)"
    # FAILED: a run that stopped itself as failed (a non-finite loss)
    return f"FAILED ({end.reason})" if end.failed else "COMPLETED"


def read_result(path: pathlib.Path) -> tuple[str, Any] | None:
    """submitit's result pickle: ("success", value) or ("error", traceback text)."""
    try:
        with path.open("rb") as handle:
            outcome = pickle.load(handle)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    return outcome if isinstance(outcome, tuple) and len(outcome) == 2 else None


def final_state(slurm_state: str | None, outcome: str | None) -> str:
    """Combine Slurm's state and the files' outcome; never COMPLETED without a summary.

    Slurm's own end states (FAILED, CANCELLED, TIMEOUT, ...) stand. Its COMPLETED only says
    the batch script exited 0, so then, as when Slurm has forgotten the job, the files decide.
    """
    if slurm_state and slurm_state not in (LEFT_QUEUE, "COMPLETED"):
        return slurm_state
    if outcome:
        return outcome
    if slurm_state == "COMPLETED":
        return f"UNKNOWN (Slurm says COMPLETED, but this job wrote no {SUMMARY})"
    return f"UNKNOWN (the scheduler has forgotten the job and its run left no {SUMMARY})"


def local_alive(pid: str) -> bool:
    """Is the submitit local controller with this pid still running?"""
    try:
        return b"submitit" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


# -- status -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """What `hpcddp status` prints about one job."""

    job_id: str
    state: str
    nodes: str = ""
    reason: str = ""
    run_dir: str = ""
    summary: bool = False
    stdout: str = ""
    recovery: str = ""  # the last failure and how long the run took to step again

    def lines(self) -> list[str]:
        """``key: value`` lines, the reason only while the job waits."""
        rows = [("job", self.job_id), ("state", self.state), ("nodes", self.nodes or "-")]
        if self.reason and self.state == "PENDING":
            rows.append(("reason", self.reason))
        run_dir = self.run_dir or "unknown (not submitted with hpcddp submit)"
        rows += [("run dir", run_dir), (SUMMARY, "yes" if self.summary else "no")]
        if self.stdout:
            rows.append(("output", self.stdout))
        if self.recovery:
            rows.append(("last recovery", self.recovery))
        return [f"{key + ':':<14}{value}" for key, value in rows]


def job_status(
    job_id: str, run: Runner | None = None, directory: pathlib.Path | None = None
) -> list[JobStatus]:
    """The status of a job (or of every task of an array) from Slurm, the index and files."""
    records = find_records(job_id, directory)
    if not records:
        slurm = scontrol_record(job_id, run)
        if slurm is None:
            raise ConfigError(
                f"no job {job_id}: Slurm does not know it and the job index "
                f"{directory or jobs_dir()} has no record of it. HINT: check the id "
                "(`hpcddp submit` printed it), and HPCDDP_JOBS_DIR if you set it."
            )
        return [
            JobStatus(
                job_id=job_id,
                state=slurm.get("JobState", "UNKNOWN"),
                nodes=_nodes(slurm),
                reason=slurm.get("Reason", ""),
                stdout=slurm.get("StdOut", ""),
            )
        ]
    return [_record_status(record, run) for record in records]


def _record_status(record: JobRecord, run: Runner | None) -> JobStatus:
    slurm, silence = None, ""
    if record.cluster == "slurm":
        try:
            slurm = scontrol_record(record.job_id, run)
        except SlurmUnreachable as err:  # say so, and still tell what the run's files say
            silence = str(err).split(" HINT:")[0]
    if record.cluster == "local":
        state = "RUNNING" if local_alive(record.job_id) else None
    else:
        state = slurm.get("JobState") if slurm else LEFT_QUEUE
    outcome = file_outcome(record)
    summary = summary_path(record.run_dir).exists()
    recovered = attempts.last_recovery(record.run_dir)
    return JobStatus(
        job_id=record.name,
        state=(outcome or f"UNKNOWN ({silence})") if silence else final_state(state, outcome),
        nodes=_nodes(slurm) if slurm else ("localhost" if record.cluster == "local" else ""),
        reason=(slurm or {}).get("Reason", ""),
        run_dir=record.run_dir,
        summary=summary,
        stdout=record.stdout,
        recovery=recovered.as_line() if recovered else "",
    )


def _nodes(slurm: dict[str, str]) -> str:
    nodes = slurm.get("NodeList", "")
    return "" if nodes in ("", "(null)") else nodes


# -- logs -------------------------------------------------------------------------------------


def log_paths(
    job_id: str, rank: int | None, run: Runner | None = None, directory: pathlib.Path | None = None
) -> list[pathlib.Path]:
    """The files `hpcddp logs` prints: the job's output, or one rank's log in the run dir."""
    records = find_records(job_id, directory)
    if len(records) > 1:
        raise ConfigError(
            f"job {job_id} is an array of {len(records)} tasks. HINT: name one "
            f"task, e.g. `hpcddp logs {records[0].job_id}`."
        )
    if records and rank is not None:
        return [rank_log(records[0].run_dir, rank)]
    if records:
        return [pathlib.Path(records[0].stdout), pathlib.Path(records[0].stderr)]
    slurm = scontrol_record(job_id, run)
    if slurm is None:
        raise ConfigError(
            f"no job {job_id}: Slurm does not know it and the job index has no "
            "record of it. HINT: check the id and HPCDDP_JOBS_DIR."
        )
    if rank is not None:
        raise ConfigError(
            f"job {job_id} was not submitted with `hpcddp submit`, so its run "
            "directory is unknown. HINT: read <run.dir>/logs/rank-R.log directly."
        )
    paths = [slurm.get("StdOut", ""), slurm.get("StdErr", "")]
    return [pathlib.Path(p) for p in dict.fromkeys(paths) if p]
