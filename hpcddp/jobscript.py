"""``hpcddp sbatch``: render a job script from the config's ``slurm`` section and submit it.

Two parsers read the script, and every value is made safe for the one that reads it. bash
reads the body, so every value there goes through `shlex.quote`. sbatch reads the
``#SBATCH`` lines with its own small parser: whitespace ends a value, ``"`` and ``\\`` are
special and ``#`` starts a comment. Values that reach those lines are therefore checked
against a conservative set of characters and refused with a `ConfigError` otherwise; a
newline would start a new line of the script, so it is never allowed there.

Preemption: Slurm signals the batch shell (``--signal=B:USR2@N``) before the time limit; the
shell passes the signal on to ``srun``, which forwards it to every process of every task. The
trainer checkpoints and requeues the job (``--requeue``) itself; where it cannot (no
``scontrol`` inside its container) it exits with `exit_codes.STOPPED_NOT_REQUEUED` (75) and
the batch shell, which runs outside the container, requeues the job instead.
"""

import argparse
import dataclasses
import re
import shlex
import subprocess
import sys
from typing import NamedTuple

from hpcddp import __version__, exit_codes
from hpcddp.config import Config, SlurmConfig
from hpcddp.errors import ConfigError, HpcddpError, LaunchError


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

# sbatch options that hpcddp sets itself (here, or through submitit in `hpcddp.submission`),
# each with the slurm field that sets it ("" when none does); `slurm.extra` may not repeat them.
OWN_OPTIONS = {
    "job-name": "job_name", "nodes": "nodes", "ntasks-per-node": "tasks_per_node",
    "gpus-per-node": "gpus_per_node", "cpus-per-task": "cpus_per_task", "mem": "mem_gb",
    "time": "time_min", "partition": "partition", "account": "account", "qos": "qos",
    "signal": "signal_delay_s", "output": "", "error": "", "open-mode": "", "array": "",
    "requeue": "",
}
_EXTRA_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]*")
# What sbatch's #SBATCH parser passes through unchanged: printable ASCII without whitespace,
# quotes, backslash or '#'.
_SBATCH_VALUE = re.compile(r"[!$%&(-\[\]-~]+")
_SBATCH_UNSAFE = " \"#'\\"
_OVERRIDE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

_PREAMBLE = """\
set -euo pipefail
: "${SLURM_JOB_ID:?submit this script with sbatch}"
# Since Slurm 22.05 srun no longer inherits --cpus-per-task; without this, loaders starve.
export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK

# Slurm signals this shell alone (--signal=B:USR2@...) before the time limit, and bash runs
# a trap only between commands: so srun runs in the background while the shell waits, and
# the trap passes the signal to srun, which forwards it to every task.
signals=0
forward() {
    signals=$((signals + 1))
    echo "hpcddp: SIG$1 received; forwarding it to the job step" >&2
    if [[ -n ${!:-} ]]; then kill -s "$1" "$!" 2>/dev/null || true; fi
}
trap 'forward USR2' USR2
trap 'forward TERM' TERM

echo "hpcddp: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: $SLURM_NTASKS tasks"
# --kill-on-bad-exit: one failed rank ends the step instead of leaving the others hanging.
"""

_EPILOGUE = f"""\
srun_pid=$!
# A trapped signal ends `wait` early (status > 128) while srun still runs: wait again.
while :; do
    seen=$signals
    status=0
    wait "$srun_pid" || status=$?
    ((status > 128 && signals > seen)) || break
done
# The trainer exits 75 when it stopped for the time limit with a checkpoint saved but could
# not requeue the job itself (no scontrol in its container); this shell runs outside it.
if ((status == {exit_codes.STOPPED_NOT_REQUEUED})); then
    echo "hpcddp: the step stopped to be requeued; requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID" || echo "hpcddp: requeue failed; resubmit to resume" >&2
fi
exit "$status"
"""


def format_time(minutes: int) -> str:
    """Slurm's time format: ``HH:MM:00`` below a day, ``D-HH:MM:00`` from one day on."""
    days, rest = divmod(minutes, 24 * 60)
    clock = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{clock}" if days else clock


def _sbatch_value(where: str, value: object) -> str:
    """A value for an ``#SBATCH`` line, or a ConfigError saying why it cannot be one."""
    text = str(value)
    if _SBATCH_VALUE.fullmatch(text):
        return text
    bad = next((c for c in text if c in _SBATCH_UNSAFE or not _SBATCH_VALUE.fullmatch(c)), "")
    shown = f"the character {bad!r}" if bad else "nothing"
    raise ConfigError(f"{where}={text!r} cannot go into an #SBATCH line: it contains {shown}. "
                      "HINT: use letters, digits and . _ - : , = + @ / only (no spaces, "
                      "quotes, '#', backslashes or newlines).")


def _with_options(slurm: SlurmConfig, options: dict) -> SlurmConfig:
    """The slurm section with command-line options laid over it (and checked again)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown sbatch option {unknown[0]!r}; valid options: "
                          f"{', '.join(OPTIONS)}.")
    changes = {OPTIONS[k].field: v for k, v in options.items() if v is not None}
    return dataclasses.replace(slurm, **changes)


def refuse_own_option(name: str) -> None:
    """Refuse a ``slurm.extra`` option that hpcddp already sets (``mail_type`` is ``mail-type``)."""
    option = name.replace("_", "-")
    if option in OWN_OPTIONS:
        field = OWN_OPTIONS[option]
        fix = f"set slurm.{field} instead" if field else "hpcddp sets it; remove it"
        raise ConfigError(f"slurm.extra.{name} would set --{option} twice. HINT: {fix}.")


def _extra_lines(extra: dict) -> list[str]:
    """``slurm.extra`` as options: ``true``/empty is a bare flag, ``false`` leaves it out."""
    lines = []
    for name, value in extra.items():
        if not isinstance(name, str) or not _EXTRA_NAME.fullmatch(name):
            raise ConfigError(f"slurm.extra option name {name!r} is not an sbatch option name. "
                              "HINT: letters, digits and dashes, as in mail-type: END.")
        refuse_own_option(name)
        if value is True or value is None or value == "":
            lines.append(f"--{name}")
        elif value is not False:
            lines.append(f"--{name}={_sbatch_value(f'slurm.extra.{name}', value)}")
    return lines


def sbatch_options(slurm: SlurmConfig) -> list[str]:
    """The ``#SBATCH`` options (without the prefix) for one slurm section."""
    if slurm.signal_delay_s and slurm.signal_delay_s >= slurm.time_min * 60:
        raise ConfigError(f"slurm.signal_delay_s={slurm.signal_delay_s} is not shorter than "
                          f"slurm.time_min={slurm.time_min} minutes, so the job would be "
                          "signalled at once. HINT: lower slurm.signal_delay_s or raise time_min.")
    opts = [f"--job-name={_sbatch_value('slurm.job_name', slurm.job_name)}"] if slurm.job_name else []
    opts += [f"--nodes={slurm.nodes}", f"--ntasks-per-node={slurm.tasks_per_node}"]
    opts += [f"--gpus-per-node={slurm.gpus_per_node}"] if slurm.gpus_per_node > 0 else []
    opts += [f"--cpus-per-task={slurm.cpus_per_task}"]
    if slurm.mem_gb:
        gb = slurm.mem_gb
        opts.append(f"--mem={int(gb)}G" if gb == int(gb) else f"--mem={round(gb * 1024)}M")
    # A requeued job keeps its job id, so it appends to the output of its earlier runs.
    opts += [f"--time={format_time(slurm.time_min)}", "--output=%x-%j.out", "--open-mode=append"]
    for name in ("partition", "account", "qos"):
        value = getattr(slurm, name)
        opts += [f"--{name}={_sbatch_value(f'slurm.{name}', value)}"] if value else []
    if slurm.signal_delay_s:
        opts.append(f"--signal=B:USR2@{slurm.signal_delay_s}")
    return [*opts, "--requeue", *_extra_lines(slurm.extra)]


def _comment(text: str) -> str:
    """Text that stays on one comment line: control characters shown as escapes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _check_overrides(overrides: list[str]) -> None:
    """Overrides must be ``dotted.key=value``, so none can pass for an option of ``train``."""
    for text in overrides:
        key = text.partition("=")[0]
        if "=" not in text or not _OVERRIDE_KEY.fullmatch(key):
            raise ConfigError(f"override {text!r} is not of the form section.key=value. "
                              "HINT: e.g. optim.lr=0.01 train.epochs=3")


def render(config: Config, config_path: str | None, overrides: list[str], *,
           python: str = "python3", options: dict | None = None,
           version: str = __version__) -> str:
    """A complete sbatch script that trains ``config_path`` with ``overrides`` under srun."""
    options = options or {}
    _check_overrides(overrides)
    slurm = _with_options(config.slurm, options)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items() if v is not None]
    command = ["hpcddp", "sbatch", *([config_path] if config_path else []), *overrides, *flags]
    train = [python, "-m", "hpcddp", "train",
             *([f"--config={config_path}"] if config_path else []), *overrides]
    return "\n".join([
        "#!/bin/bash",
        f"# Generated by hpcddp {_comment(version)}: {_comment(shlex.join(command))}",
        *(f"#SBATCH {opt}" for opt in sbatch_options(slurm)),
        "",
        _PREAMBLE + f"srun --kill-on-bad-exit=1 {shlex.join(train)} &",
        _EPILOGUE,
    ])


def submit(script: str, timeout_s: float = 120) -> str:
    """Submit the script with sbatch; return the job id or raise with sbatch's reason.

    A cluster that does not enforce partition limits accepts a job larger than the partition
    and leaves it pending forever, so the scheduler is asked first (``--test-only``).
    """
    for flag in ("--test-only", "--parsable"):
        done = _sbatch(flag, script, timeout_s)
        if done.returncode != 0:
            raise HpcddpError(f"sbatch refused the job: {_sbatch_reason(done.stderr)}. HINT: "
                              "check what the partition offers (`sinfo -o '%P %D %c %G'`) "
                              "against --nodes, --tasks-per-node, --cpus-per-task, "
                              "--gpus-per-node and --partition.")
    return done.stdout.strip().split(";")[0]


def _sbatch(flag: str, script: str, timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``sbatch FLAG`` with the script on stdin."""
    try:
        return subprocess.run(["sbatch", flag], input=script, capture_output=True, text=True,
                              timeout=timeout_s)
    except FileNotFoundError:
        raise LaunchError("sbatch was not found on PATH, so the job cannot be submitted. HINT: "
                          "run this on a Slurm login node, or use --dry-run to print the "
                          "script.") from None
    except subprocess.TimeoutExpired:
        raise HpcddpError(f"sbatch did not answer within {timeout_s:.0f} s. HINT: check the "
                          "controller with `sinfo`, then submit again.") from None


def _sbatch_reason(stderr: str) -> str:
    """sbatch's last error line, without its ``sbatch: error:`` or similar prefix."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()] or ["(no message)"]
    return re.sub(r"^(sbatch: error: |allocation failure: )", "", lines[-1]).rstrip(".")


def cmd_sbatch(args: argparse.Namespace) -> int:
    """Render the job script for a config; print it (--dry-run) or submit it and print the id."""
    from hpcddp.cli import _split_config_and_overrides
    from hpcddp.config import load_config
    config_path, overrides = _split_config_and_overrides(args.items, None)
    if config_path is None:
        raise ConfigError("hpcddp sbatch needs a CONFIG file. "
                          "HINT: hpcddp sbatch examples/quickstart.yaml --nodes 2")
    options = {name: getattr(args, name) for name in OPTIONS}
    script = render(load_config(config_path, overrides), config_path, overrides,
                    python=args.python, options=options)
    if args.dry_run:
        print(script, end="")
        return 0
    print(submit(script), flush=True)
    return 0


def add_slurm_options(parser: argparse.ArgumentParser) -> None:
    """One ``--option`` per entry of `OPTIONS`, stored under the option's name."""
    for name, option in OPTIONS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=option.kind,
                            metavar=option.metavar,
                            help=f"{option.text} (default: the config's slurm.{option.field})")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``hpcddp sbatch`` on the CLI's subparsers."""
    parser = subparsers.add_parser(
        "sbatch", help="submit a config as a Slurm job (or print the job script)",
        description="Render a job script from the config's slurm section, options below "
        "overriding it, and submit it with sbatch. Put options before CONFIG or after all "
        "overrides.")
    parser.add_argument("items", nargs="*", metavar="CONFIG [key=value]",
                        help="a YAML config and overrides such as optim.lr=0.01")
    add_slurm_options(parser)
    parser.add_argument("--python", default=sys.executable,
                        help="the Python the job runs (default: this one, %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    parser.set_defaults(func=cmd_sbatch)
    return parser
