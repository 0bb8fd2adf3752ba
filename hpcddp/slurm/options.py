"""sbatch options from the config's ``slurm`` section, safe for sbatch's own small parser.

sbatch reads ``#SBATCH`` lines with a parser of its own: whitespace ends a value, ``"`` and
``\\`` are special and ``#`` starts a comment. Values that reach those lines are therefore
checked against a conservative set of characters and refused with a `ConfigError` otherwise;
a newline would start a new line of the script, so it is never allowed there. The same tables
serve ``hpcddp sbatch`` (`hpcddp.slurm.jobscript`) and ``hpcddp submit`` (submitit).
"""

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from hpcddp.config import SlurmConfig
from hpcddp.errors import ConfigError
from hpcddp.slurm import cpus_per_task

DEPENDENCY = "singleton"  # how a chain's links wait for each other


class SlurmOption(NamedTuple):
    """A command-line option that overrides one field of the config's slurm section."""

    field: str  # the SlurmConfig field
    kind: type
    metavar: str
    text: str


# The options of both `hpcddp sbatch` and `hpcddp submit`, named as sbatch names them
# (``time`` sets ``time_min``); ``--tasks-per-node`` for the dict key ``tasks_per_node``.
OPTIONS = {
    "nodes": SlurmOption("nodes", int, "N", "number of nodes"),
    "tasks_per_node": SlurmOption("tasks_per_node", int, "N", "tasks (ranks) per node"),
    "gpus_per_node": SlurmOption("gpus_per_node", int, "N", "GPUs per node"),
    "cpus_per_task": SlurmOption("cpus_per_task", int, "N", "CPUs per task"),
    "mem_gb": SlurmOption("mem_gb", float, "GB", "memory per node in GB"),
    "time": SlurmOption("time_min", int, "MINUTES", "time limit in minutes"),
    "partition": SlurmOption("partition", str, "PARTITION", "Slurm partition"),
    "account": SlurmOption("account", str, "ACCOUNT", "Slurm account"),
    "qos": SlurmOption("qos", str, "QOS", "Slurm QOS"),
    "job_name": SlurmOption("job_name", str, "NAME", "job name"),
}

# sbatch options that hpcddp sets itself (here, or through submitit in `hpcddp.slurm.submission`),
# each with the slurm field that sets it ("" when none does); `slurm.extra` may not repeat them.
OWN_OPTIONS = {
    "job-name": "job_name",
    "nodes": "nodes",
    "ntasks-per-node": "tasks_per_node",
    "gpus-per-node": "gpus_per_node",
    "cpus-per-task": "cpus_per_task",
    "mem": "mem_gb",
    "time": "time_min",
    "partition": "partition",
    "account": "account",
    "qos": "qos",
    "signal": "signal_delay_s",
    "output": "",
    "error": "",
    "open-mode": "",
    "array": "",
    "requeue": "",
}
_EXTRA_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]*")
# What sbatch's #SBATCH parser passes through unchanged: printable ASCII without whitespace,
# quotes, backslash or '#'.
_SBATCH_VALUE = re.compile(r"[!$%&(-\[\]-~]+")
_SBATCH_UNSAFE = " \"#'\\"


def format_time(minutes: int) -> str:
    """Slurm's time format: ``HH:MM:00`` below a day, ``D-HH:MM:00`` from one day on."""
    days, rest = divmod(minutes, 24 * 60)
    clock = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{clock}" if days else clock


def sbatch_value(where: str, value: object) -> str:
    """A value for an ``#SBATCH`` line, or a ConfigError saying why it cannot be one."""
    text = str(value)
    if _SBATCH_VALUE.fullmatch(text):
        return text
    bad = next((c for c in text if c in _SBATCH_UNSAFE or not _SBATCH_VALUE.fullmatch(c)), "")
    shown = f"the character {bad!r}" if bad else "nothing"
    raise ConfigError(
        f"{where}={text!r} cannot go into an #SBATCH line: it contains {shown}. "
        "HINT: use letters, digits and . _ - : , = + @ / only (no spaces, "
        "quotes, '#', backslashes or newlines)."
    )


def with_options(slurm: SlurmConfig, options: Mapping[str, Any]) -> SlurmConfig:
    """The slurm section with command-line options laid over it (and checked again)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown sbatch option {unknown[0]!r}; valid options: {', '.join(OPTIONS)}."
        )
    changes = {OPTIONS[k].field: v for k, v in options.items() if v is not None}
    return dataclasses.replace(slurm, **changes)


def refuse_own_option(name: str) -> None:
    """Refuse a ``slurm.extra`` option that hpcddp already sets (``mail_type`` is ``mail-type``)."""
    option = name.replace("_", "-")
    if option in OWN_OPTIONS:
        field = OWN_OPTIONS[option]
        fix = f"set slurm.{field} instead" if field else "hpcddp sets it; remove it"
        raise ConfigError(f"slurm.extra.{name} would set --{option} twice. HINT: {fix}.")


def _extra_options(extra: Mapping[str, Any]) -> list[str]:
    """``slurm.extra`` as options: ``true``/empty is a bare flag, ``false`` leaves it out."""
    options = []
    for name, value in extra.items():
        refuse_own_option(str(name))
        if not isinstance(name, str) or not _EXTRA_NAME.fullmatch(name):
            raise ConfigError(
                f"slurm.extra option name {name!r} is not an sbatch option name. "
                "HINT: letters, digits and dashes, as in mail-type: END."
            )
        if not isinstance(value, (str, int, float, bool)) and value is not None:
            raise ConfigError(
                f"slurm.extra.{name} must be a string, number or true, got "
                f"{type(value).__name__}. HINT: e.g. extra: {{constraint: a100}}."
            )
        if value is True or value is None or value == "":
            options.append(f"--{name}")
        elif value is not False:
            options.append(f"--{name}={sbatch_value(f'slurm.extra.{name}', value)}")
    return options


def _memory(mem_gb: float) -> str:
    """``--mem`` in whole gigabytes where possible, else megabytes."""
    return f"{int(mem_gb)}G" if mem_gb == int(mem_gb) else f"{round(mem_gb * 1024)}M"


# What every step of every job gets, for the job script and for submitit alike:
# one dead rank ends the step instead of leaving the others waiting in a collective,
SRUN_ARGS = ("--kill-on-bad-exit=1",)
# and since Slurm 22.05 srun no longer inherits --cpus-per-task; without this, loaders starve.
SRUN_ENV = "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}"


@dataclasses.dataclass(frozen=True)
class Request:
    """What a job asks Slurm for, derived once from a slurm section (`request`); the sbatch
    renderer (`sbatch_options`) and submitit (`hpcddp.slurm.submission`) only spell it."""

    job_name: str
    nodes: int  # spare nodes included
    tasks_per_node: int  # one per node under torchrun
    cpus_per_task: int  # the node's ranks' CPUs under torchrun
    gpus_per_node: int  # 0: none asked for
    mem_gb: float  # 0: the partition's default
    time_min: int
    partition: str
    account: str
    qos: str
    signal_delay_s: int  # 0: no --signal (torchrun would not pass it on; a chain needs none)
    extra: tuple[str, ...]  # slurm.extra as sbatch options, checked
    extra_values: dict[str, Any]  # the same, as submitit takes them


def request(slurm: SlurmConfig) -> Request:
    """The job's resources, checked: values sbatch would misread, a signal that would come at
    once and extra options hpcddp sets itself are refused with a `ConfigError`.

    With ``launcher: torchrun`` the job has one task per node, holding that node's ranks and
    their CPUs, and no ``--signal`` (torchrun would not pass it on to its workers).
    """
    torchrun = slurm.launcher == "torchrun"
    # A chain's link hands on at the trainer's own deadline and then leaves: a late USR2 would
    # only hit ranks already leaving (and submitit would requeue on it), so none is asked for.
    signal_s = 0 if torchrun or slurm.chained else slurm.signal_delay_s
    if signal_s and signal_s >= slurm.time_min * 60:
        raise ConfigError(
            f"slurm.signal_delay_s={slurm.signal_delay_s} is not shorter than "
            f"slurm.time_min={slurm.time_min} minutes, so the job would be "
            "signalled at once. HINT: lower slurm.signal_delay_s or raise time_min."
        )
    per_rank = cpus_per_task.per_rank(slurm, ())  # 0 in the config: hpcddp's default
    for name in ("job_name", "partition", "account", "qos"):
        value = getattr(slurm, name)
        if value:
            sbatch_value(f"slurm.{name}", value)
    tasks, cpus = (
        (1, per_rank * slurm.tasks_per_node)
        if torchrun
        else (
            slurm.tasks_per_node,
            per_rank,
        )
    )
    return Request(
        job_name=slurm.job_name,
        nodes=slurm.nodes + slurm.spare_nodes,
        tasks_per_node=tasks,
        cpus_per_task=cpus,
        gpus_per_node=slurm.gpus_per_node,
        mem_gb=slurm.mem_gb,
        time_min=slurm.time_min,
        partition=slurm.partition,
        account=slurm.account,
        qos=slurm.qos,
        signal_delay_s=signal_s,
        extra=tuple(_extra_options(slurm.extra)),
        extra_values=dict(slurm.extra),
    )


def sbatch_options(slurm: SlurmConfig) -> list[str]:
    """The ``#SBATCH`` options (without the prefix) for one slurm section."""
    job = request(slurm)
    opts = [f"--job-name={job.job_name}"] if job.job_name else []
    opts += [f"--nodes={job.nodes}", f"--ntasks-per-node={job.tasks_per_node}"]
    opts += [f"--gpus-per-node={job.gpus_per_node}"] if job.gpus_per_node > 0 else []
    opts += [f"--cpus-per-task={job.cpus_per_task}"]
    opts += [f"--mem={_memory(job.mem_gb)}"] if job.mem_gb else []
    # A requeued job keeps its job id, so it appends to the output of its earlier runs.
    opts += [f"--time={format_time(job.time_min)}", "--output=%x-%j.out", "--open-mode=append"]
    for name in ("partition", "account", "qos"):
        value = getattr(job, name)
        opts += [f"--{name}={value}"] if value else []
    opts += [f"--signal=B:USR2@{job.signal_delay_s}"] if job.signal_delay_s else []
    # A chain's links run one at a time, in order: one name, one user (hpcddp.slurm.chain).
    opts += [f"--dependency={DEPENDENCY}"] if slurm.chained else []
    return [*opts, "--requeue", *job.extra]
