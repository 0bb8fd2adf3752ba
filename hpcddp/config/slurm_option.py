"""A row of the Slurm option table: a `SlurmConfig` field that is also an sbatch option.

Such a field is declared with `slurm_option`, which keeps beside its default and help every
other spelling of the option: sbatch's flag, submitit's parameter, the command-line flag of
``hpcddp sbatch|submit|sweep``, a value that works, and the check its values must pass.
`hpcddp.slurm.options` derives the ``#SBATCH`` lines, submitit's parameters and the
command-line flags from these rows, so a new Slurm option is one field declaration.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from hpcddp.errors import ConfigError

T = TypeVar("T")
Check = Callable[[str, Any], None]  # (where, value): raises ConfigError for a bad value


@dataclasses.dataclass(frozen=True)
class SlurmFlag:
    """How one option is spelt where it is asked for; the field's own name is the config key."""

    sbatch: str  # sbatch's option name: "constraint" is --constraint
    submitit: str  # submitit's parameter; "": one of its slurm_additional_parameters
    cli: str  # the flag of hpcddp sbatch, submit and sweep
    example: Any  # a value that works: for --help, the tests and a golden job script
    check: Check | None = None  # besides the field's type; text is checked for sbatch too


def slurm_option(default: T, help: str, flag: SlurmFlag) -> T:
    """A config field that is also an sbatch option: one row of the option table."""
    field: T = dataclasses.field(default=default, metadata={"help": help, "slurm": flag})
    return field


def slurm_flag(field: "dataclasses.Field[Any]") -> SlurmFlag | None:
    """The field's spellings as an sbatch option; None for a field that is no such option."""
    flag = field.metadata.get("slurm")
    return flag if isinstance(flag, SlurmFlag) else None


def positive(where: str, value: float) -> None:
    """Refuse zero or below."""
    if value <= 0:
        raise ConfigError(f"{where} must be > 0, got {value}. HINT: set {where}=<positive number>.")


def not_negative(where: str, value: float) -> None:
    """Refuse below zero (0 means off, or the default)."""
    if value < 0:
        raise ConfigError(f"{where} must be >= 0, got {value}. HINT: use 0 to disable it.")


# What sbatch's --mail-type takes (any case), comma-separated.
MAIL_EVENTS = (
    *("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT"),
    *("TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"),
)


def mail_events(where: str, value: str) -> None:
    """Refuse a --mail-type list with an event Slurm does not know."""
    unknown = [e for e in value.split(",") if value and e.strip().upper() not in MAIL_EVENTS]
    if unknown:
        raise ConfigError(
            f"{where}={value!r}: {unknown[0]!r} is not a Slurm mail event; valid events: "
            f"{', '.join(MAIL_EVENTS)}. HINT: {where}=END,FAIL mails when the job ends or fails."
        )


def mail_needs_user(mail_type: str, mail_user: str) -> None:
    """Mail asked for without an address: Slurm would mail a local account nobody reads."""
    if mail_type and mail_type.upper() != "NONE" and not mail_user:
        raise ConfigError(
            f"slurm.mail_type={mail_type} but slurm.mail_user is empty, so the mail would go to "
            "your account on the cluster. HINT: set slurm.mail_user=you@example.org, or "
            "slurm.mail_type= for no mail."
        )
