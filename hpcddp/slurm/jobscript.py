"""Job scripts: one template (``job.sh.in``), rendered for ``hpcddp sbatch`` and for ``sbatch/``.

The body of every job script hpcddp hands to Slurm lives in one file shipped with the package;
this module fills in its few blanks. Two parsers read the result and every value is made safe
for the one that reads it: bash reads the body, so every value there goes through
`shlex.quote`; sbatch reads the ``#SBATCH`` lines (`hpcddp.slurm.options`).
``sbatch/train.sh`` and ``sbatch/train-torchrun.sh`` are renders of the defaults, checked in;
``python -m hpcddp.slurm.jobscript sbatch`` rewrites them and a test fails when they drift.

Preemption: Slurm signals the batch shell (``--signal=B:USR2@N``) before the time limit; the
shell passes the signal on to ``srun``, which forwards it to every process of every task. The
trainer checkpoints and requeues the job (``--requeue``) itself; where it cannot (no
``scontrol`` inside its container) it exits with `exit_codes.STOPPED_NOT_REQUEUED`. Before
the first step and after every step the shell asks `hpcddp.slurm.policy` what to do next (run
a step on which nodes, requeue with which nodes excluded, or stop) and does it, outside the
container. A chain's links (``slurm.chain``) carry a job name of their run directory's and
``--dependency=singleton`` instead of ``--signal``; see `hpcddp.slurm.chain`.

``slurm.setup`` lines are the site's shell code and are copied in as they are; the container
(`container_lines`) wraps the ranks and the Python helpers, never the shell itself.
"""

import dataclasses
import importlib.resources
import pathlib
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hpcddp import __version__, exit_codes
from hpcddp.config import Config, SlurmConfig, split_override
from hpcddp.config.sections import ContainerConfig
from hpcddp.errors import HpcddpError, LaunchError
from hpcddp.slurm.chain import chained
from hpcddp.slurm.container import gpu_lines, pyxis_args, wrapper_args
from hpcddp.slurm.cpus_per_task import NodeShape, no_nodes, with_cpus
from hpcddp.slurm.options import SRUN_ARGS, SRUN_ENV, cli_flags, sbatch_options, with_options

_PLACEHOLDER = re.compile(r"\{\{ (\w+) \}\}")
# The scripts in the repository's sbatch/ folder: the defaults, with each launcher.
CHECKED_IN = {"train.sh": "srun", "train-torchrun.sh": "torchrun"}
CHECKED_IN_CONFIG = "examples/quickstart.yaml"


def template() -> str:
    """The job-script template shipped with the package."""
    return importlib.resources.files("hpcddp.slurm").joinpath("job.sh.in").read_text()


def fill(text: str, values: Mapping[str, str]) -> str:
    """Replace every ``{{ name }}``; a name without a value (or a value without a use) is a bug."""
    used = set(_PLACEHOLDER.findall(text))
    if used != set(values):
        raise ValueError(f"template names {sorted(used)}, values given for {sorted(values)}")
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], text)


def _comment(text: str) -> str:
    """Text that stays on one comment line: control characters shown as escapes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _check_overrides(overrides: Sequence[str]) -> None:
    """Overrides must be ``dotted.key=value``, so none can pass for an option of ``train``."""
    for text in overrides:
        split_override(text)


def setup_lines(lines: Sequence[str]) -> str:
    """``slurm.setup`` as it goes into the script (a comment when there is none)."""
    if not lines:
        return "# (no slurm.setup lines)"
    # The site's own scripts are not ours to lint; sourcing them is the point.
    body = "\n".join(f"    {line}" for line in lines)
    return f"# shellcheck disable=SC1090,SC1091\n{{\n{body}\n}}"


def container_lines(container: ContainerConfig, gpus_per_node: int) -> str:
    """Bash arrays: ``container`` (the command prefix of every rank) and ``helper`` (how this
    shell runs hpcddp's Python helpers), and for pyxis the srun options that enter the image."""
    wrapper = wrapper_args(container, gpus_per_node)
    gpus = "".join(
        f"# Whenever Slurm gave the job GPUs, the container gets them\n{line}\n"
        for line in gpu_lines(container)
    )
    if wrapper:
        return f'{gpus}container=({shlex.join(wrapper)})\nhelper=("${{container[@]}}" "$PYTHON")'
    pyxis = pyxis_args(container)
    if pyxis:
        options = f'{shlex.join(pyxis)} "--container-workdir=$PWD"'
        return gpus + "\n".join(
            [
                "container=()",
                f"srun_args+=({options})",
                f'helper=(srun --nodes=1 --ntasks=1 {options} "$PYTHON")',
            ]
        )
    return 'container=()\nhelper=("$PYTHON")'


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """What the job runs: the config as loaded here, and how the job loads it again.

    ``config`` decides the ``#SBATCH`` lines now; inside the job ``python`` reads
    ``config_path`` with ``overrides`` once more, so the four travel together. With ``check``
    the job runs the pre-flight (`hpcddp check`) instead of training.
    """

    config: Config
    config_path: str | None
    overrides: Sequence[str] = ()
    python: str = "python3"
    check: bool = False


@dataclasses.dataclass(frozen=True)
class Origin:
    """Who made the script, as its header says, and so whether it is written for one config.

    ``hpcddp sbatch`` (``command=None``) writes a script for the config in hand: the header
    repeats its command line and torchrun's ranks per node are ``slurm.tasks_per_node``. A
    checked-in script serves any config: it names its own generator, and with
    ``fixed_ranks=False`` the ranks per node are derived when the job starts (from
    NPROC_PER_NODE, the node's GPUs or the task's CPUs).
    """

    version: str = __version__
    command: Sequence[str] | None = None
    fixed_ranks: bool = True


HPCDDP_SBATCH = Origin()
"""The origin of a script ``hpcddp sbatch`` writes."""


def render(
    job: JobSpec,
    *,
    options: Mapping[str, Any] | None = None,
    node_shapes: Callable[[str], Sequence[NodeShape]] = no_nodes,
    origin: Origin = HPCDDP_SBATCH,
) -> str:
    """A complete sbatch script that runs ``job``.

    ``options`` are `hpcddp.slurm.options.OPTIONS` laid over the config's slurm section.
    ``node_shapes`` describes the partition's nodes, for a GPU job's default CPUs per task
    (`hpcddp.slurm.cpus_per_task`; `hpcddp sbatch` asks sinfo).
    """
    options = dict(options or {})
    _check_overrides(job.overrides)
    slurm = with_cpus(with_options(job.config.slurm, options), node_shapes)
    # A chain's links share a name made from the run directory; the pre-flight is one job.
    slurm = dataclasses.replace(slurm, chain=1) if job.check else chained(slurm, job.config.run.dir)
    command = origin.command
    if command is None:
        flags = [*cli_flags(options), *(["--check"] if job.check else [])]
        path = [job.config_path] if job.config_path else []
        command = ["hpcddp", "sbatch", *path, *job.overrides, *flags]
    header = f"Generated by hpcddp {_comment(origin.version)}: {_comment(shlex.join(command))}"
    return fill(
        template(),
        {
            "header": header,
            "sbatch": "\n".join(f"#SBATCH {opt}" for opt in sbatch_options(slurm)),
            "python": shlex.quote(job.python),
            "config": shlex.quote(job.config_path or ""),
            "overrides": " ".join(map(shlex.quote, job.overrides)),
            "launcher": slurm.launcher,
            "nproc_per_node": str(slurm.tasks_per_node) if origin.fixed_ranks else "",
            "srun_env": SRUN_ENV,
            "srun_flags": shlex.join(SRUN_ARGS),
            "command": "check" if job.check else "train",
            "setup": setup_lines(slurm.setup),
            "container": container_lines(slurm.container, slurm.gpus_per_node),
        },
    )


def render_checked_in(name: str, version: str = __version__) -> str:
    """The text ``sbatch/<name>`` must have: the defaults, rendered with its launcher."""
    config = Config(slurm=SlurmConfig(launcher=CHECKED_IN[name]))
    generator = ("python", "-m", "hpcddp.slurm.jobscript", "sbatch")
    return render(
        JobSpec(config, CHECKED_IN_CONFIG),
        origin=Origin(version=version, command=generator, fixed_ranks=False),
    )


def submit(script: str, timeout_s: float = 120) -> str:
    """Submit the script with sbatch; return the job id or raise with sbatch's reason.

    A cluster that does not enforce partition limits accepts a job larger than the partition
    and leaves it pending forever, so the scheduler is asked first (``--test-only``).
    """
    for flag in ("--test-only", "--parsable"):
        done = _sbatch(flag, script, timeout_s)
        if done.returncode != 0:
            raise HpcddpError(
                f"sbatch refused the job: {_sbatch_reason(done.stderr)}. HINT: check what the "
                "cluster offers (`sinfo -o '%P %D %c %G %f'`: partitions, nodes, CPUs, GPUs, "
                "features; `scontrol show reservation`) against the script's #SBATCH lines."
            )
    return done.stdout.strip().split(";")[0]


def _sbatch(flag: str, script: str, timeout_s: float) -> "subprocess.CompletedProcess[str]":
    """Run ``sbatch FLAG`` with the script on stdin."""
    try:
        return subprocess.run(
            ["sbatch", flag], input=script, capture_output=True, text=True, timeout=timeout_s
        )
    except FileNotFoundError:
        raise LaunchError(
            "sbatch was not found on PATH, so the job cannot be submitted. HINT: "
            "run this on a Slurm login node, or use --dry-run to print the script."
        ) from None
    except subprocess.TimeoutExpired:
        raise HpcddpError(
            f"sbatch did not answer within {timeout_s:.0f} s. HINT: check the "
            "controller with `sinfo`, then submit again."
        ) from None


def _sbatch_reason(stderr: str) -> str:
    """sbatch's last error line, without its ``sbatch: error:`` or similar prefix."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()] or ["(no message)"]
    return re.sub(r"^(sbatch: error: |allocation failure: )", "", lines[-1]).rstrip(".")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpcddp.slurm.jobscript DIR``: write the checked-in scripts into DIR."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m hpcddp.slurm.jobscript SBATCH_DIR", file=sys.stderr)
        return exit_codes.USAGE
    for name in CHECKED_IN:
        path = pathlib.Path(args[0]) / name
        path.write_text(render_checked_in(name))
        path.chmod(0o755)
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
