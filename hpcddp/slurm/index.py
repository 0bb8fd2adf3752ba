"""The job index: a small record of every job `hpcddp.submit` starts, written at submission.

Many clusters have no ``sacct`` (accounting disabled: submitit#1720, torchx#1101), and
``squeue``/``scontrol`` forget a job ``MinJobAge`` seconds after it ends. So every submitted
job leaves ``${HPCDDP_JOBS_DIR:-~/.cache/hpcddp/jobs}/<jobid>.json``, saying where its run
directory and output files are; `hpcddp.job_status` reads it once Slurm has forgotten the job.
"""

import dataclasses
import json
import os
import pathlib
import re
from collections.abc import Mapping

from hpcddp.errors import ConfigError
from hpcddp.storage.atomic import atomic_write_text


def jobs_dir(environ: Mapping[str, str] = os.environ) -> pathlib.Path:
    """Where the job index lives: ``$HPCDDP_JOBS_DIR`` or ``~/.cache/hpcddp/jobs``."""
    return pathlib.Path(environ.get("HPCDDP_JOBS_DIR") or "~/.cache/hpcddp/jobs").expanduser()


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """What `hpcddp.submit` remembers about one job (one array task for a sweep)."""

    job_id: str  # Slurm's id (``123`` or ``123_4``), or the local controller's pid
    cluster: str  # "slurm" or "local"
    run_dir: str  # absolute
    submitit_folder: str  # absolute
    stdout: str  # task 0's output files (submitit writes one pair per task)
    stderr: str
    num_tasks: int
    submitted_at: float  # epoch seconds; a summary.json older than this is a previous run's

    @property
    def name(self) -> str:
        """How the job is named in the index and on the command line (``local-PID`` if local)."""
        return self.job_id if self.cluster == "slurm" else f"local-{self.job_id}"

    def result_pickle(self) -> pathlib.Path:
        """submitit's record of what task 0 returned or raised."""
        return pathlib.Path(self.submitit_folder) / f"{self.job_id}_0_result.pkl"


def write_record(record: JobRecord, directory: pathlib.Path | None = None) -> pathlib.Path:
    """Save one record (atomically and durably: a reader never sees half a file)."""
    directory = directory or jobs_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record.name}.json"
    atomic_write_text(path, json.dumps(dataclasses.asdict(record), indent=2) + "\n")
    return path


def find_records(job_id: str, directory: pathlib.Path | None = None) -> list[JobRecord]:
    """The records for ``job_id``: one job, one array task, or every task of array ``job_id``."""
    directory = directory or jobs_dir()
    if not re.fullmatch(r"(local-)?[\w.-]+", job_id):
        return []  # not a job id (a path, a glob): no record could be named after it
    names = [job_id] if job_id.startswith("local-") else [job_id, f"local-{job_id}"]
    for name in names:
        if (directory / f"{name}.json").exists():
            return [_load(directory / f"{name}.json")]
    if "_" in job_id or job_id.startswith("local-"):
        return []
    paths = sorted(directory.glob(f"{job_id}_*.json"), key=lambda p: _array_index(p.stem))
    return [_load(path) for path in paths]


def _load(path: pathlib.Path) -> JobRecord:
    try:
        return JobRecord(**json.loads(path.read_text()))
    except (ValueError, TypeError) as err:
        raise ConfigError(
            f"job index entry {path} is unreadable ({err}). HINT: delete it; "
            "it only serves `hpcddp status` and `hpcddp logs`."
        ) from None


def _array_index(stem: str) -> int:
    tail = stem.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else -1
