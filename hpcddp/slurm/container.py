"""How ranks enter a container, one place for the job script and for submit().

apptainer/singularity wrap the command (``apptainer exec --nv --bind ... IMAGE python ...``);
pyxis is srun options (``srun --container-image=IMAGE ...``). Only the ranks (and hpcddp's
Python helpers) run inside: the batch shell, which signals, requeues and excludes nodes with
Slurm's tools, stays outside, since images rarely carry ``scontrol``.

Whenever Slurm gave the job GPUs the container gets them, whatever ``slurm.gpus_per_node`` said
(``sbatch --gpus-per-node=4 job.sh`` on a script rendered without GPUs): the job decides at run
time (`gpu_lines`), since only then does Slurm say what it gave.
"""

from hpcddp.config.sections import ContainerConfig

WRAPPERS = ("apptainer", "singularity")
# Slurm gave this job GPUs on this node (both are set in the batch shell and in every task).
SLURM_GAVE_GPUS = "[[ -n ${SLURM_JOB_GPUS:-} || ${SLURM_GPUS_ON_NODE:-0} != 0 ]]"
# What each runtime reads from the environment to bring the GPUs in: APPTAINER_NV is
# `apptainer exec --nv`; enroot's NVIDIA hook (pyxis) mounts the devices NVIDIA_VISIBLE_DEVICES
# names, which images not built from NVIDIA's leave unset.
GPU_ENVIRONMENT = {
    "apptainer": "APPTAINER_NV=1",
    "singularity": "SINGULARITY_NV=1",
    "pyxis": "NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-all} "
    "NVIDIA_DRIVER_CAPABILITIES=${NVIDIA_DRIVER_CAPABILITIES:-compute,utility}",
}


def gpu_lines(container: ContainerConfig) -> list[str]:
    """Shell lines (for the job script and submitit's setup) that give the container the GPUs
    whenever Slurm gave the job some; none without a container."""
    if container.runtime not in GPU_ENVIRONMENT:
        return []
    return [f"if {SLURM_GAVE_GPUS}; then export {GPU_ENVIRONMENT[container.runtime]}; fi"]


def wrapper_args(container: ContainerConfig, gpus_per_node: int) -> list[str]:
    """``apptainer exec [--nv] [--bind P ...] [options] IMAGE`` (empty for none and pyxis)."""
    if container.runtime not in WRAPPERS:
        return []
    args = [container.runtime, "exec", *(["--nv"] if gpus_per_node else [])]
    args += [arg for path in container.bind for arg in ("--bind", path)]
    return [*args, *container.options, container.image]


def pyxis_args(container: ContainerConfig) -> list[str]:
    """srun options that run every task in a pyxis (enroot) image (empty otherwise)."""
    if container.runtime != "pyxis":
        return []
    mounts = [f"--container-mounts={','.join(container.bind)}"] if container.bind else []
    return [f"--container-image={container.image}", *mounts, *container.options]
