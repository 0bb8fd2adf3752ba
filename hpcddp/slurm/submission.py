"""`hpcddp.submit`: start a run on Slurm from Python, without waiting for it.

The config's ``slurm`` section becomes submitit parameters; every task of the job runs the
same trainer as ``hpcddp train`` (`TrainTask`), so a submitted run and an ``sbatch`` run of one
config end with the same weights. Where Slurm is absent (no ``sbatch``, or no controller
answering) submitit's local executor runs the tasks on this machine instead.

submitit's own ``job.result()`` refuses multi-task jobs and waits on ``sacct``, which hangs
forever on clusters without accounting (submitit#1720) when a job dies before writing its
result. The jobs returned here return task 0's result (every rank agrees on the summary) and
read the job's state from ``squeue``; see `hpcddp.slurm.queue`. A sweep's job array is
submitted by `hpcddp.slurm.sweep_submit` through the same executor (`executor_for`), and its
failed points resubmitted by `hpcddp.slurm.sweep_retry`.
"""

import dataclasses
import logging
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import submitit
from submitit.local.local import LocalJob
from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

from hpcddp.config import (
    Config,
    SlurmConfig,
    load_config,
    with_overrides,
    with_values,
)
from hpcddp.config.sections import ContainerConfig
from hpcddp.errors import ConfigError, LaunchError
from hpcddp.outcome import RunOutcome
from hpcddp.slurm import cpus_per_task
from hpcddp.slurm import index as job_index
from hpcddp.slurm import queue as slurm_queue
from hpcddp.slurm.chain import chain_name, submit_links
from hpcddp.slurm.container import gpu_lines, pyxis_args, wrapper_args
from hpcddp.slurm.cpus_per_task import with_cpus
from hpcddp.slurm.options import SRUN_ARGS, SRUN_ENV, request, submitit_parameters
from hpcddp.slurm.tasks import CheckTask, TrainTask

log = logging.getLogger(__name__)

CLUSTERS = ("slurm", "local")
SLURM_OPTIONS = tuple(field.name for field in dataclasses.fields(SlurmConfig))


# -- jobs whose result() works with many tasks and without sacct ------------------------------


class _SqueueWatcher(SlurmInfoWatcher):
    """submitit's shared state poller, reading ``squeue`` instead of ``sacct``."""

    def update(self) -> None:
        """One ``squeue`` call for every registered job that has not finished."""
        pending = self._registered - self._finished
        if not pending:
            return
        self._num_calls += 1
        self._info_dict.update(slurm_queue.query_states(pending))
        self._last_status_check = time.time()
        for job_id in pending:
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        """Done once Slurm shows an end state, or no longer lists the job at all."""
        state = self.get_state(job_id, mode=mode)
        return state != "UNKNOWN" and state.split()[0] not in slurm_queue.ACTIVE_STATES


class SlurmRun(SlurmJob[RunOutcome]):
    """A submitted Slurm job (or array task) of hpcddp ranks."""

    watcher = _SqueueWatcher(delay_s=30)

    def result(self) -> RunOutcome:
        """Waits for every task; task 0's outcome (the ranks agree); raises if any task failed."""
        return self.results()[0]


class LocalRun(LocalJob[RunOutcome]):
    """A job of hpcddp ranks run by submitit's local executor on this machine."""

    def result(self) -> RunOutcome:
        """Waits for every task; task 0's outcome (the ranks agree); raises if any task failed."""
        return self.results()[0]


def adopt(job: Any, folder: pathlib.Path, cluster: str) -> SlurmRun | LocalRun:
    """The same job, as one of the classes above."""
    tasks = list(range(job.num_tasks))
    if cluster == "local":
        # submitit keeps the local controller's Popen on the job; it is how done() polls.
        return LocalRun(folder=folder, job_id=job.job_id, tasks=tasks, process=job._process)
    return SlurmRun(folder=folder, job_id=job.job_id, tasks=tasks)


# -- configuration ----------------------------------------------------------------------------


def resolve_config(
    config: Config | str | os.PathLike[str],
    overrides: Sequence[str] = (),
    slurm_options: Mapping[str, Any] | None = None,
) -> Config:
    """A checked Config from a Config or YAML path, ``key=value`` overrides and slurm options."""
    slurm_options = dict(slurm_options or {})
    unknown = sorted(set(slurm_options) - set(SLURM_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown submission option(s) {unknown}; valid options: "
            f"{', '.join(SLURM_OPTIONS)}. HINT: they override the config's "
            "slurm section, e.g. submit(config, nodes=2, tasks_per_node=4)."
        )
    if isinstance(config, Config):
        resolved = with_overrides(config, list(overrides))
    elif isinstance(config, (str, os.PathLike)):
        resolved = load_config(os.fspath(config), list(overrides))
    else:
        raise ConfigError(
            f"config must be a hpcddp.Config or a YAML path, got "
            f"{type(config).__name__}. HINT: submit('examples/quickstart.yaml')."
        )
    resolved = with_values(resolved, [(["slurm", k], v) for k, v in slurm_options.items()])
    if resolved.slurm.launcher != "srun":
        raise ConfigError(
            f"slurm.launcher={resolved.slurm.launcher} cannot be submitted from Python: submit() "
            "starts one task per rank with srun. HINT: hpcddp sbatch renders a torchrun job "
            "script; or set slurm.launcher=srun."
        )
    return resolved


def executor_parameters(slurm: SlurmConfig) -> dict[str, Any]:
    """The job's `request` as submitit AutoExecutor parameters, with the srun settings and
    setup lines every step gets (the trainer checkpoints on SIGUSR2 and requeues itself)."""
    if slurm.spare_nodes:
        raise ConfigError(
            f"slurm.spare_nodes={slurm.spare_nodes}: restarting on a spare node is done by the "
            "job script's shell, which submitit's job does not have. HINT: use `hpcddp sbatch` "
            "(or sbatch/train.sh) for spare nodes, or set slurm.spare_nodes=0 for submit()."
        )
    if slurm.shrink_on_failure:
        raise ConfigError(
            "slurm.shrink_on_failure=true: going on with the nodes left is done by the job "
            "script's shell, which submitit's job does not have. HINT: use `hpcddp sbatch` (or "
            "sbatch/train.sh) to shrink on failure, or set slurm.shrink_on_failure=false."
        )
    params = submitit_parameters(request(slurm))
    params["slurm_srun_args"] = [*SRUN_ARGS, *pyxis_args(slurm.container)]
    # The container gets the GPUs whenever Slurm gave some (hpcddp.slurm.container).
    params["slurm_setup"] = [SRUN_ENV, *gpu_lines(slurm.container), *slurm.setup]
    return params


def container_python(container: ContainerConfig, gpus_per_node: int) -> str | None:
    """The command submitit starts Python with, inside an apptainer/singularity image."""
    wrapper = wrapper_args(container, gpus_per_node)
    return shlex.join([*wrapper, sys.executable]) if wrapper else None


# -- where the job runs -----------------------------------------------------------------------


def choose_cluster(
    cluster: str | None = None,
    which: Callable[[str], str | None] | None = None,
    run: Callable[..., "subprocess.CompletedProcess[str]"] | None = None,
) -> str:
    """``cluster`` if given, else Slurm when ``sbatch`` exists and a controller answers."""
    which, run = which or shutil.which, run or subprocess.run
    if cluster is not None:
        if cluster not in CLUSTERS:
            raise ConfigError(
                f"cluster={cluster!r} is not one of {list(CLUSTERS)}. "
                "HINT: leave it out to choose automatically."
            )
        if cluster == "slurm" and which("sbatch") is None:
            raise LaunchError(
                "cluster='slurm' but sbatch is not on PATH. HINT: submit from a "
                "login node, or use cluster='local' to run on this machine."
            )
        return cluster
    if which("sbatch") is None:
        return "local"
    try:  # a wrong SLURM_CONF makes Slurm clients retry for a minute
        reply = run(["scontrol", "ping"], capture_output=True, text=True, timeout=15)
        answered = reply.returncode == 0 and "UP" in reply.stdout
        seen = (reply.stdout + reply.stderr).strip().splitlines()[-1:] or ["no output"]
    except (OSError, subprocess.SubprocessError) as err:
        answered, seen = False, [str(err)]
    if answered:
        return "slurm"
    # Training on a login node by accident is worse than an error that says what to do.
    raise LaunchError(
        f"sbatch is on PATH but no Slurm controller answered `scontrol ping` "
        f"({seen[0]}). HINT: check SLURM_CONF and the controller, or pass "
        "cluster='local' (--cluster local) to run on this machine on purpose."
    )


def executor_for(config: Config, cluster: str, **extra: Any) -> submitit.AutoExecutor:
    """A submitit AutoExecutor for ``cluster`` with the config's resources."""
    if cluster == "local" and config.slurm.nodes > 1:
        raise ConfigError(
            f"slurm.nodes={config.slurm.nodes}, but without Slurm the job runs "
            "on this one machine. HINT: set nodes=1 (tasks_per_node ranks run "
            "here), or submit from a machine where sbatch works."
        )

    folder = pathlib.Path(config.run.dir).absolute() / "submitit"
    python = container_python(config.slurm.container, config.slurm.gpus_per_node)
    inside = {"slurm_python": python} if python and cluster == "slurm" else {}
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster, **inside)
    nodes = cpus_per_task.node_shapes if cluster == "slurm" else cpus_per_task.no_nodes
    try:
        executor.update_parameters(**executor_parameters(with_cpus(config.slurm, nodes)), **extra)
    except (ValueError, NameError, AssertionError) as err:
        raise ConfigError(f"submitit refused the slurm settings: {err}") from None
    return executor


def job_record(job: Any, config: Config, cluster: str, submitted_at: float) -> job_index.JobRecord:
    """What `hpcddp status` and `hpcddp logs` will need once Slurm has forgotten the job."""
    return job_index.JobRecord(
        job_id=str(job.job_id),
        cluster=cluster,
        run_dir=str(pathlib.Path(config.run.dir).absolute()),
        submitit_folder=str(job.paths.folder),
        stdout=str(job.paths.stdout),
        stderr=str(job.paths.stderr),
        num_tasks=job.num_tasks,
        submitted_at=submitted_at,
    )


# -- the entry point --------------------------------------------------------------------------


def submit(
    config: Config | str | os.PathLike[str],
    overrides: Sequence[str] = (),
    *,
    cluster: str | None = None,
    check: bool = False,
    **slurm_options: Any,
) -> SlurmRun | LocalRun:
    """Submit one run and return at once; ``job.result()`` waits and returns its summary.

    ``slurm_options`` override the config's slurm section (``nodes=2, tasks_per_node=4,
    time_min=30, ...``). ``cluster`` forces ``"slurm"`` or ``"local"``. ``check=True`` submits
    the pre-flight (`hpcddp check`) with the same resources instead of training: its
    ``result()`` is ``{"errors": N, "problems": [...], "report": {...}}``. submitit's files go to
    ``<run.dir>/submitit/``; `hpcddp.slurm.index` records the job for ``hpcddp status`` and
    ``logs``.
    """
    config = resolve_config(config, overrides, slurm_options)
    cluster = choose_cluster(cluster)
    if check:  # the pre-flight is one job, chain or not
        config = with_values(config, [(["slurm", "chain"], 1)])
    if config.slurm.chained:
        return _submit_chain(config, cluster)
    executor = executor_for(config, cluster)
    submitted_at = time.time()
    task = CheckTask(config) if check else TrainTask(config)
    job = adopt(executor.submit(task), executor.folder, cluster)
    job_index.write_record(job_record(job, config, cluster, submitted_at))
    log.info(
        "submitted job %s (%s, %d tasks), run dir %s",
        job.job_id,
        cluster,
        job.num_tasks,
        config.run.dir,
    )
    return job


def _submit_chain(config: Config, cluster: str) -> SlurmRun | LocalRun:
    """The run as ``slurm.chain`` links (`hpcddp.slurm.chain`); the first link's job."""
    if cluster != "slurm":
        raise ConfigError(
            f"slurm.chain={config.slurm.chain} links Slurm jobs, but this run would go to "
            "submitit's local executor. HINT: set slurm.chain=1 to run here, or submit where "
            "sbatch works."
        )
    config = with_values(
        config, [(["slurm", "job_name"], chain_name(config.slurm.job_name, config.run.dir))]
    )
    executor = executor_for(config, cluster)
    jobs: list[SlurmRun | LocalRun] = []

    def submit_one(_: int) -> str:
        submitted_at = time.time()
        jobs.append(adopt(executor.submit(TrainTask(config)), executor.folder, cluster))
        job_index.write_record(job_record(jobs[-1], config, cluster, submitted_at))
        return str(jobs[-1].job_id)

    record = submit_links(submit_one, config.run.dir, config.slurm.job_name, config.slurm.chain)
    log.info(
        "submitted chain %s: jobs %s, run dir %s",
        record.name,
        ",".join(record.links),
        config.run.dir,
    )
    return jobs[0]
