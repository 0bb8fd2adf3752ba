"""The Slurm option table, spelt three ways: ``#SBATCH`` lines, submitit parameters, flags.

The rows are the `SlurmConfig` fields declared with `hpcddp.config.slurm_option.slurm_option`;
this module derives everything else from them: `request` (what a job asks for, checked once),
`sbatch_options` (the job script's ``#SBATCH`` lines, `hpcddp.slurm.jobscript`),
`submitit_parameters` (``hpcddp submit``, `hpcddp.slurm.submission`) and `OPTIONS` (the
command-line flags, `hpcddp.cli.args`). A new Slurm option is a new row, nothing here.

sbatch reads ``#SBATCH`` lines with a parser of its own: whitespace ends a value, ``"`` and
``\\`` are special and ``#`` starts a comment. Values that reach those lines are therefore
checked against a conservative set of characters and refused with a `ConfigError` otherwise;
a newline would start a new line of the script, so it is never allowed there.
"""

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from hpcddp.config import SlurmConfig
from hpcddp.config.loading import field_types
from hpcddp.config.sections import field_help
from hpcddp.config.slurm_option import SlurmFlag, slurm_flag
from hpcddp.errors import ConfigError
from hpcddp.slurm import cpus_per_task

DEPENDENCY = "singleton"  # how a chain's links wait for each other
_UNITS = {"_min": "MINUTES", "_gb": "GB", "_s": "SECONDS"}


@dataclasses.dataclass(frozen=True)
class Option:
    """One row of the option table: a `SlurmConfig` field and how each way of asking spells it."""

    field: str  # the SlurmConfig field, and the keyword of hpcddp.submit
    kind: type  # int, float, str or bool
    flag: SlurmFlag
    text: str  # the field's help

    @property
    def dest(self) -> str:
        """The command-line option's name once parsed: ``--mem-gb`` gives ``mem_gb``."""
        return self.flag.cli.lstrip("-").replace("-", "_")

    @property
    def metavar(self) -> str:
        """What ``--help`` shows for the value: the unit in the field's name, else its name."""
        unit = next((u for suffix, u in _UNITS.items() if self.field.endswith(suffix)), "")
        return unit or ("N" if self.kind is int else self.field.upper())


def _table() -> tuple[Option, ...]:
    """The rows, in the order `SlurmConfig` declares them (the order of the #SBATCH lines)."""
    kinds = field_types(SlurmConfig)
    return tuple(
        Option(field.name, kinds[field.name], flag, field_help(field))
        for field in dataclasses.fields(SlurmConfig)
        if (flag := slurm_flag(field))
    )


TABLE = _table()
# The command-line options of hpcddp sbatch, submit and sweep, by their parsed name.
OPTIONS = {option.dest: option for option in TABLE}
# sbatch options hpcddp sets itself besides the table's, each with the slurm field that sets
# it ("" when none does); `slurm.extra` may repeat neither these nor the table's.
_FIXED = {
    "signal": "signal_delay_s",
    "output": "",
    "error": "",
    "open-mode": "",
    "array": "",
    "requeue": "",
}
OWN_OPTIONS = {**{option.flag.sbatch: option.field for option in TABLE}, **_FIXED}
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
    """The slurm section with command-line options (`OPTIONS`, by name) laid over it, checked."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown sbatch option {unknown[0]!r}; valid options: {', '.join(OPTIONS)}. "
            "HINT: they are the --flags of hpcddp sbatch, with dashes as underscores."
        )
    changes = {OPTIONS[k].field: v for k, v in options.items() if v is not None}
    return dataclasses.replace(slurm, **changes)


def cli_flags(options: Mapping[str, Any]) -> list[str]:
    """The command-line flags that give ``options`` (``--time=30``, ``--exclusive``)."""
    flags = []
    for name, value in options.items():
        flag = OPTIONS[name].flag.cli
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag.lstrip('-')}")
        elif value is not None:
            flags.append(f"{flag}={value}")
    return flags


def refuse_own_option(name: str) -> None:
    """Refuse a ``slurm.extra`` option that hpcddp already sets (``mail_type`` is ``mail-type``)."""
    option = name.replace("_", "-")
    if option in OWN_OPTIONS:
        field = OWN_OPTIONS[option]
        fix = f"set slurm.{field} instead" if field else "hpcddp sets it; remove it"
        raise ConfigError(f"slurm.extra.{name} would set --{option} twice. HINT: {fix}.")


def _extra_options(extra: Mapping[str, Any]) -> tuple[tuple[str, str | bool], ...]:
    """``slurm.extra``, checked: (name, value) with True for a bare flag; ``false`` is left out."""
    options: list[tuple[str, str | bool]] = []
    for name, value in extra.items():
        refuse_own_option(str(name))
        if not isinstance(name, str) or not _EXTRA_NAME.fullmatch(name):
            raise ConfigError(
                f"slurm.extra option name {name!r} is not an sbatch option name. "
                "HINT: letters, digits and dashes, as in hold: true."
            )
        if not isinstance(value, (str, int, float, bool)) and value is not None:
            raise ConfigError(
                f"slurm.extra.{name} must be a string, number or true, got "
                f"{type(value).__name__}. HINT: e.g. extra: {{gres: 'gpu:1'}}."
            )
        if value is True or value is None or value == "":
            options.append((name, True))
        elif value is not False:
            options.append((name, sbatch_value(f"slurm.extra.{name}", value)))
    return tuple(options)


def _memory(mem_gb: float) -> str:
    """``--mem`` in whole gigabytes where possible, else megabytes."""
    return f"{int(mem_gb)}G" if mem_gb == int(mem_gb) else f"{round(mem_gb * 1024)}M"


# How sbatch writes the values of the options whose text is not the value itself.
_SBATCH_TEXT: dict[str, Callable[[Any], str]] = {"time": format_time, "mem": _memory}

# What every step of every job gets, for the job script and for submitit alike:
# one dead rank ends the step instead of leaving the others waiting in a collective,
SRUN_ARGS = ("--kill-on-bad-exit=1",)
# and since Slurm 22.05 srun no longer inherits --cpus-per-task; without this, loaders starve.
SRUN_ENV = "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}"


@dataclasses.dataclass(frozen=True)
class Request:
    """What a job asks Slurm for, derived once from a slurm section (`request`); the sbatch
    renderer (`sbatch_options`) and submitit (`submitit_parameters`) only spell it."""

    asked: tuple[tuple[Option, Any], ...]  # the table's rows with a value (not 0, "" or false)
    signal_delay_s: int  # 0: no --signal (torchrun would not pass it on; a chain needs none)
    dependency: str  # "": none; a chain's links wait for each other
    requeue: bool  # Slurm may requeue the job (the trainer does so at preemption)
    extra: tuple[tuple[str, str | bool], ...]  # slurm.extra, checked; True: a bare flag


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
    tasks, cpus = (
        (1, per_rank * slurm.tasks_per_node) if torchrun else (slurm.tasks_per_node, per_rank)
    )
    derived = {
        "nodes": slurm.nodes + slurm.spare_nodes,
        "tasks_per_node": tasks,
        "cpus_per_task": cpus,
    }
    values = {option: derived.get(option.field, getattr(slurm, option.field)) for option in TABLE}
    for option, value in values.items():
        if isinstance(value, str) and value:
            sbatch_value(f"slurm.{option.field}", value)
    return Request(
        asked=tuple((option, value) for option, value in values.items() if value),
        signal_delay_s=signal_s,
        # A chain's links run one at a time, in order: one name, one user (hpcddp.slurm.chain).
        dependency=DEPENDENCY if slurm.chained else "",
        requeue=True,
        extra=_extra_options(slurm.extra),
    )


def _sbatch_option(name: str, value: Any) -> str:
    """``--name=value``, or ``--name`` for a flag."""
    if value is True:
        return f"--{name}"
    return f"--{name}={_SBATCH_TEXT.get(name, str)(value)}"


def sbatch_options(slurm: SlurmConfig) -> list[str]:
    """The ``#SBATCH`` options (without the prefix) for one slurm section."""
    job = request(slurm)
    opts = [_sbatch_option(option.flag.sbatch, value) for option, value in job.asked]
    # A requeued job keeps its job id, so it appends to the output of its earlier runs.
    opts += ["--output=%x-%j.out", "--open-mode=append"]
    opts += [f"--signal=B:USR2@{job.signal_delay_s}"] if job.signal_delay_s else []
    opts += [f"--dependency={job.dependency}"] if job.dependency else []
    opts += ["--requeue"] if job.requeue else []
    return opts + [_sbatch_option(name, value) for name, value in job.extra]


def submitit_parameters(job: Request) -> dict[str, Any]:
    """The request as submitit AutoExecutor parameters (``slurm_*`` apply on Slurm only); an
    option submitit has no parameter for goes into its ``slurm_additional_parameters``."""
    params: dict[str, Any] = {"slurm_signal_delay_s": job.signal_delay_s}  # its default is 90
    more: dict[str, Any] = {"requeue": True} if job.requeue else {}
    more |= {"dependency": job.dependency} if job.dependency else {}
    for option, value in job.asked:
        if option.flag.submitit:
            params[option.flag.submitit] = value
        else:
            more[option.flag.sbatch] = value
    return {**params, "slurm_additional_parameters": {**more, **dict(job.extra)}}
