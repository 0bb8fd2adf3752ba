"""How ranks enter a container, one place for the job script and for submit().

apptainer/singularity wrap the command (``apptainer exec --nv --bind ... IMAGE python ...``);
pyxis is srun options (``srun --container-image=IMAGE ...``). Only the ranks (and hpcddp's
Python helpers) run inside: the batch shell, which signals, requeues and excludes nodes with
Slurm's tools, stays outside, since images rarely carry ``scontrol``.
"""

from hpcddp.config.sections import ContainerConfig

WRAPPERS = ("apptainer", "singularity")


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
