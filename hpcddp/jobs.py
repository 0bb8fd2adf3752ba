"""Submitted jobs after the fact: their state and their logs, with or without Slurm accounting.

Many clusters have no ``sacct`` (accounting disabled: submitit#1720, torchx#1101), and
``squeue``/``scontrol`` forget a job ``MinJobAge`` seconds after it ends. So every job
`hpcddp.submit` starts leaves a small record in a job index
(``${HPCDDP_JOBS_DIR:-~/.cache/hpcddp/jobs}/<jobid>.json``): where its run directory and
output files are. The state comes from Slurm while Slurm remembers the job, and from the run's
own files afterwards. A job is only ever called COMPLETED when its run directory holds a
``summary.json`` written after it was submitted (a failed job reported as COMPLETED is
hydra#1928).
"""

import argparse
import dataclasses
import json
import os
import pathlib
import pickle
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping

from hpcddp.errors import ConfigError

Runner = Callable[..., subprocess.CompletedProcess]

# Slurm states in which a job may still produce output (everything else is an end state).
ACTIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
    "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "PREEMPTED", "RESV_DEL_HOLD",
})
# The state of a job that Slurm no longer lists: it ended at least MinJobAge seconds ago.
LEFT_QUEUE = "LEFT_QUEUE"


def jobs_dir(environ: Mapping[str, str] = os.environ) -> pathlib.Path:
    """Where the job index lives: ``$HPCDDP_JOBS_DIR`` or ``~/.cache/hpcddp/jobs``."""
    return pathlib.Path(environ.get("HPCDDP_JOBS_DIR") or "~/.cache/hpcddp/jobs").expanduser()


# -- the job index ----------------------------------------------------------------------------


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
    """Save one record (atomically: a reader never sees half a file)."""
    directory = directory or jobs_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record.name}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(dataclasses.asdict(record), indent=2) + "\n")
    tmp.replace(path)
    return path


def find_records(job_id: str, directory: pathlib.Path | None = None) -> list[JobRecord]:
    """The records for ``job_id``: one job, one array task, or every task of array ``job_id``."""
    directory = directory or jobs_dir()
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
        raise ConfigError(f"job index entry {path} is unreadable ({err}). HINT: delete it; "
                          "it only serves `hpcddp status` and `hpcddp logs`.") from None


def _array_index(stem: str) -> int:
    tail = stem.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else -1


# -- what Slurm says --------------------------------------------------------------------------


def _run(command: list[str], run: Runner | None,
         timeout_s: float = 30) -> subprocess.CompletedProcess | None:
    """Run a Slurm client; None when it is missing or hangs (no controller, no config)."""
    try:
        return (run or subprocess.run)(command, capture_output=True, text=True,
                                       timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None


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
    result = _run(["squeue", "-h", "-t", "all", "-j", ",".join(arrays), "-o", "%i|%T|%N|%r"],
                  run)
    if result is None or (result.returncode != 0 and "Invalid job id" not in result.stderr):
        return {}
    states = parse_squeue(result.stdout if result.returncode == 0 else "")
    for job_id in ids:
        states.setdefault(job_id, {"State": LEFT_QUEUE, "NodeList": "", "Reason": ""})
    return states


_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_scontrol(text: str) -> list[dict[str, str]]:
    """``scontrol show job -o`` output -> one dict per job record (array tasks are records)."""
    records = []
    for line in text.splitlines():
        keys = list(_KEY.finditer(line))
        if not keys:
            continue
        record = {}
        for match, following in zip(keys, keys[1:] + [None]):
            end = following.start() if following else len(line)
            record[match.group(1)] = line[match.end():end].strip()
        records.append(record)
    return records


def scontrol_record(job_id: str, run: Runner | None = None) -> dict[str, str] | None:
    """Slurm's view of one job (``123`` or ``123_4``); None once it has forgotten the job."""
    result = _run(["scontrol", "show", "job", "-o", job_id], run)
    if result is None or result.returncode != 0:
        return None
    records = parse_scontrol(result.stdout)
    if "_" in job_id:  # a pending array may still be one record covering many tasks
        array_id, index = job_id.split("_", 1)
        records = [r for r in records if _covers(r.get("ArrayTaskId", ""), int(index))] or records
    return records[0] if records else None


def _covers(task_ids: str, index: int) -> bool:
    """Does an ``ArrayTaskId`` such as ``3`` or ``0-7%2`` or ``1,4-5`` include ``index``?"""
    for part in task_ids.split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and int(low) <= index <= int(high if high.isdigit() else low):
            return True
    return False


# -- the outcome ------------------------------------------------------------------------------


def file_outcome(record: JobRecord) -> str | None:
    """What the run's own files say: COMPLETED, STOPPED, FAILED, or None (nothing yet)."""
    result = _read_result(record.result_pickle())
    if result is not None and result[0] == "error":
        return "FAILED"
    if result is not None and isinstance(result[1], dict) and result[1].get("stopped"):
        return "STOPPED"
    summary = pathlib.Path(record.run_dir) / "summary.json"
    if summary.exists() and summary.stat().st_mtime >= record.submitted_at - 1:
        return "COMPLETED"
    return None


def _read_result(path: pathlib.Path) -> tuple | None:
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
        return "UNKNOWN (Slurm says COMPLETED, but this job wrote no summary.json)"
    return "UNKNOWN (the scheduler has forgotten the job and its run left no summary.json)"


def _local_alive(pid: str) -> bool:
    """Is the submitit local controller with this pid still running?"""
    try:
        return b"submitit" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


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

    def lines(self) -> list[str]:
        """``key: value`` lines, the reason only while the job waits."""
        rows = [("job", self.job_id), ("state", self.state), ("nodes", self.nodes or "-")]
        if self.reason and self.state == "PENDING":
            rows.append(("reason", self.reason))
        run_dir = self.run_dir or "unknown (not submitted with hpcddp submit)"
        rows += [("run dir", run_dir), ("summary.json", "yes" if self.summary else "no")]
        if self.stdout:
            rows.append(("output", self.stdout))
        return [f"{key + ':':<14}{value}" for key, value in rows]


def job_status(job_id: str, run: Runner | None = None,
               directory: pathlib.Path | None = None) -> list[JobStatus]:
    """The status of a job (or of every task of an array) from Slurm, the index and files."""
    records = find_records(job_id, directory)
    if not records:
        slurm = scontrol_record(job_id, run)
        if slurm is None:
            raise ConfigError(f"no job {job_id}: Slurm does not know it and the job index "
                              f"{directory or jobs_dir()} has no record of it. HINT: check the id "
                              "(`hpcddp submit` printed it), and HPCDDP_JOBS_DIR if you set it.")
        return [JobStatus(job_id=job_id, state=slurm.get("JobState", "UNKNOWN"),
                          nodes=_nodes(slurm), reason=slurm.get("Reason", ""),
                          stdout=slurm.get("StdOut", ""))]
    return [_record_status(record, run) for record in records]


def _record_status(record: JobRecord, run: Runner) -> JobStatus:
    slurm = scontrol_record(record.job_id, run) if record.cluster == "slurm" else None
    if record.cluster == "local":
        state = "RUNNING" if _local_alive(record.job_id) else None
    else:
        state = slurm.get("JobState") if slurm else LEFT_QUEUE
    summary = (pathlib.Path(record.run_dir) / "summary.json").exists()
    return JobStatus(job_id=record.name, state=final_state(state, file_outcome(record)),
                     nodes=_nodes(slurm) if slurm else ("localhost" if record.cluster == "local"
                                                        else ""),
                     reason=(slurm or {}).get("Reason", ""), run_dir=record.run_dir,
                     summary=summary, stdout=record.stdout)


def _nodes(slurm: dict[str, str]) -> str:
    nodes = slurm.get("NodeList", "")
    return "" if nodes in ("", "(null)") else nodes


# -- logs -------------------------------------------------------------------------------------


def log_paths(job_id: str, rank: int | None, run: Runner | None = None,
              directory: pathlib.Path | None = None) -> list[pathlib.Path]:
    """The files `hpcddp logs` prints: the job's output, or one rank's log in the run dir."""
    records = find_records(job_id, directory)
    if len(records) > 1:
        raise ConfigError(f"job {job_id} is an array of {len(records)} tasks. HINT: name one "
                          f"task, e.g. `hpcddp logs {records[0].job_id}`.")
    if records and rank is not None:
        return [pathlib.Path(records[0].run_dir) / "logs" / f"rank-{rank}.log"]
    if records:
        return [pathlib.Path(records[0].stdout), pathlib.Path(records[0].stderr)]
    slurm = scontrol_record(job_id, run)
    if slurm is None:
        raise ConfigError(f"no job {job_id}: Slurm does not know it and the job index has no "
                          "record of it. HINT: check the id and HPCDDP_JOBS_DIR.")
    if rank is not None:
        raise ConfigError(f"job {job_id} was not submitted with `hpcddp submit`, so its run "
                          "directory is unknown. HINT: read <run.dir>/logs/rank-R.log directly.")
    paths = [slurm.get("StdOut", ""), slurm.get("StdErr", "")]
    return [pathlib.Path(p) for p in dict.fromkeys(paths) if p]


# -- the command line -------------------------------------------------------------------------

_SUBMIT_OPTIONS = (  # (flag, SlurmConfig field, type, help)
    ("--nodes", "nodes", int, "number of nodes"),
    ("--tasks-per-node", "tasks_per_node", int, "tasks (ranks) per node"),
    ("--gpus-per-node", "gpus_per_node", int, "GPUs per node"),
    ("--cpus-per-task", "cpus_per_task", int, "CPUs per task"),
    ("--mem-gb", "mem_gb", float, "memory per node in GB"),
    ("--time", "time_min", int, "time limit in minutes"),
    ("--partition", "partition", str, "Slurm partition"),
    ("--account", "account", str, "Slurm account"),
    ("--qos", "qos", str, "Slurm QOS"),
    ("--job-name", "job_name", str, "job name"),
)


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit the configured run and print its job id (does not wait)."""
    from hpcddp.cli import _split_config_and_overrides
    from hpcddp.submission import submit
    # argparse stops reading options at the first positional; read the rest here, so options
    # may follow CONFIG: `hpcddp submit CONFIG --nodes 2 optim.lr=0.1`.
    late = argparse.ArgumentParser(prog="hpcddp submit")
    _add_submit_options(late)
    late.add_argument("items", nargs="*")
    more = late.parse_intermixed_args(args.items)
    config_path, overrides = _split_config_and_overrides(more.items, None)
    if config_path is None:
        raise ConfigError("no config given. HINT: hpcddp submit examples/quickstart.yaml "
                          "[--nodes N ...] [key=value ...]")
    options = {}
    for _, field, _, _ in _SUBMIT_OPTIONS:
        value = getattr(more, field) if getattr(more, field) is not None else getattr(args, field)
        if value is not None:
            options[field] = value
    job = submit(config_path, overrides, cluster=more.cluster or args.cluster, **options)
    job_name = f"local-{job.job_id}" if _is_local(job) else job.job_id
    print(job_name, flush=True)
    print(f"hpcddp: submitted job {job_name}; follow it with `hpcddp status {job_name}` and "
          f"`hpcddp logs {job_name}`", file=sys.stderr)
    return 0


def _add_submit_options(parser: argparse.ArgumentParser) -> None:
    for flag, field, kind, text in _SUBMIT_OPTIONS:
        parser.add_argument(flag, dest=field, type=kind,
                            help=f"{text} (default: the config's slurm.{field})")
    parser.add_argument("--cluster", choices=("slurm", "local"), default=None,
                        help="where to run (default: Slurm when sbatch and a controller answer, "
                        "else this machine)")


def _is_local(job) -> bool:
    from submitit.local.local import LocalJob
    return isinstance(job, LocalJob)


def cmd_status(args: argparse.Namespace) -> int:
    """Print a job's state, nodes, pending reason, run directory and whether it finished."""
    statuses = job_status(args.job_id)
    print("\n\n".join("\n".join(status.lines()) for status in statuses), flush=True)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """Print the job's output files, or one rank's log with --rank."""
    if args.rank is not None and args.rank < 0:
        raise ConfigError(f"--rank must be >= 0, got {args.rank}.")
    paths = log_paths(args.job_id, args.rank)
    existing = [p for p in paths if p.exists()]
    if not existing:
        print(f"hpcddp: job {args.job_id} has no output yet ({', '.join(map(str, paths))} "
              "missing). HINT: `hpcddp status " f"{args.job_id}` says whether it started.",
              file=sys.stderr)
        return 1
    for path in existing:
        if len(existing) > 1:
            print(f"==> {path} <==", flush=True)
        sys.stdout.write(path.read_text(errors="replace"))
    sys.stdout.flush()
    return 0


def add_parsers(subparsers) -> None:
    """Register ``submit``, ``status`` and ``logs`` on the ``hpcddp`` command's subparsers."""
    submit = subparsers.add_parser("submit", help="submit a run to Slurm (or run it locally) "
                                   "and print the job id without waiting")
    _add_submit_options(submit)
    submit.add_argument("items", nargs=argparse.REMAINDER, metavar="CONFIG [key=value]",
                        help="a YAML config and overrides such as optim.lr=0.01")
    submit.set_defaults(func=cmd_submit)

    status = subparsers.add_parser("status", help="state, nodes and outputs of a submitted job")
    status.add_argument("job_id", metavar="JOBID")
    status.set_defaults(func=cmd_status)

    logs = subparsers.add_parser("logs", help="print a submitted job's output, or one rank's log")
    logs.add_argument("job_id", metavar="JOBID")
    logs.add_argument("--rank", type=int, default=None,
                      help="print <run.dir>/logs/rank-R.log instead of the job's output")
    logs.set_defaults(func=cmd_logs)
