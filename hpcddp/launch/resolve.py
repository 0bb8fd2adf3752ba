"""`resolve_env`: this process's place in the job, its device and its backend.

The launch context places the process (`hpcddp.launch.contexts`); here the device and backend
are chosen and the whole is checked, so an inconsistency is a `LaunchError` with a hint
instead of a hang in ``init_process_group``. torch is imported only to list GPUs, inside
`hpcddp.launch.gpus.visible_gpus`, so the login node never pays for it. The device chosen here
is this rank's own guess: the rendezvous, which sees every rank's GPUs, has the last word.
"""

import dataclasses
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence

from hpcddp.errors import LaunchError
from hpcddp.launch import gpus, leftovers
from hpcddp.launch.contexts import CONTEXTS, HINTS
from hpcddp.launch.distenv import DistEnv

BACKENDS = ("gloo", "nccl")
_DEVICE = re.compile(r"cuda(:\d+)?")


Table = Callable[[], Sequence[gpus.Gpu]]


def visible_cuda_devices() -> int:
    """How many GPUs this process can see (0 without torch or CUDA)."""
    return len(gpus.visible_gpus())


def _table(cuda_devices: Callable[[], int] | None, devices: Table | None) -> tuple[gpus.Gpu, ...]:
    """The device table if one was given, else one from a bare count, else torch's."""
    if devices is not None:
        return tuple(devices())
    if cuda_devices is not None:
        return gpus.counted(cuda_devices())
    return gpus.visible_gpus()


def choose_device(local_rank: int, visible: int) -> str:
    """Pick this rank's GPU without ever rewriting CUDA_VISIBLE_DEVICES.

    A task that sees exactly one GPU was bound to it by Slurm, so it is ``cuda:0`` whatever its
    local rank; a task that sees the whole node takes ``local_rank % visible``.
    """
    if visible <= 0:
        return "cpu"
    return "cuda:0" if visible == 1 else f"cuda:{local_rank % visible}"


def cpus_for_this_rank(env: DistEnv, environ: Mapping[str, str]) -> int | None:
    """The CPUs this rank may use of those Slurm gave its task, or None when Slurm says nothing.

    Only a Slurm step runs one rank per task; torchrun, ``hpcddp train --nproc`` and submitit's
    local executor run all of a node's ranks inside one task, so they share its CPUs.
    """
    for name in ("SLURM_CPUS_PER_TASK", "SRUN_CPUS_PER_TASK"):
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            shared_by = 1 if env.launcher == "slurm" else max(env.local_world_size, 1)
            return max(int(value) // shared_by, 1)
    return None


def _device(
    environ: Mapping[str, str], local_rank: int, visible: int, why_no_gpu: Callable[..., str]
) -> str:
    """This rank's device, chosen from the ``visible`` GPUs.

    ``HPCDDP_DEVICE=cuda`` without an index means "CUDA, the usual choice of index", not
    ``cuda:0`` for every rank; an explicit device such as ``cpu`` or ``cuda:1`` is taken as is.
    A rank that Slurm gave GPUs but that sees none is refused: it would train on CPU.
    """
    wanted = environ.get("HPCDDP_DEVICE")
    if wanted == "cpu":
        return wanted
    if wanted and not _DEVICE.fullmatch(wanted):
        raise LaunchError(
            f"HPCDDP_DEVICE={wanted!r} is not a device hpcddp can use; expected cpu, cuda or "
            "cuda:N. HINT: HPCDDP_DEVICE=cuda picks each rank's GPU; unset it to choose "
            "automatically."
        )
    if wanted and visible <= 0:
        raise LaunchError(
            f"HPCDDP_DEVICE={wanted} but this process sees no GPU. HINT: request GPUs "
            "(--gpus-per-node), check CUDA_VISIBLE_DEVICES, or unset HPCDDP_DEVICE."
        )
    if wanted and wanted != "cuda":
        index = int(wanted.partition(":")[2])
        if index >= visible:
            raise LaunchError(
                f"HPCDDP_DEVICE={wanted} but this process sees only {visible} GPU(s) "
                f"(cuda:0 to cuda:{visible - 1}). HINT: HPCDDP_DEVICE=cuda picks each rank's "
                "GPU by its local rank; indices count the GPUs in CUDA_VISIBLE_DEVICES."
            )
        return wanted
    if visible <= 0 and gpus.slurm_gave_gpus(environ):
        raise LaunchError(why_no_gpu(environ))
    return choose_device(local_rank, visible)


def _check_gpu_per_rank(p: DistEnv, visible: int) -> None:
    """Refuse a task with more NCCL ranks than GPUs: two ranks on one GPU hang NCCL.

    Ranks that share one task (torchrun, a local launch) see the same GPUs, so fewer GPUs than
    ranks means sharing. A Slurm task may instead be bound to GPUs of its own
    (``--gpus-per-task``, ``--gpu-bind=closest``, ``map_gpu``): what it sees says nothing about
    its neighbours, so the rendezvous decides by the GPUs' UUIDs (`hpcddp.launch.gpus`).
    """
    if not 0 < visible < p.local_world_size or p.launcher == "slurm":
        return
    raise LaunchError(
        f"{p.launcher}: {p.local_world_size} ranks on this node but this rank sees only "
        f"{visible} GPU(s), so ranks would share a GPU and NCCL would hang. HINT: request one "
        "GPU per rank (`--gpus-per-task=1`), or start fewer tasks per node."
    )


def _check_placement(p: DistEnv) -> None:
    """Refuse inconsistent numbers here rather than hang in init_process_group."""
    problems = []
    if p.world_size < 1:
        problems.append(f"world size {p.world_size} < 1")
    if not 0 <= p.rank < p.world_size:
        problems.append(f"rank {p.rank} is not in [0, {p.world_size})")
    if not 0 <= p.local_rank < max(p.local_world_size, 1):
        problems.append(f"local rank {p.local_rank} is not in [0, {p.local_world_size})")
    if problems:
        raise LaunchError(
            f"{p.launcher}: inconsistent launch information: "
            f"{'; '.join(problems)}. HINT: {HINTS[p.launcher]}"
        )


def _place(environ: Mapping[str, str], ancestors: Callable[[], Sequence[int]]) -> DistEnv:
    """The launch context's placement, after removing a shell's left-over local variables."""
    cleaned, left = leftovers.split_leftovers(environ, ancestors)
    context = next(c for c in CONTEXTS if c.detect(cleaned))
    if left and context.name == "single":
        raise LaunchError(f"single: {leftovers.leftovers_message(environ, left)}")
    placement = context.resolve(cleaned)
    _check_placement(placement)
    return placement


def _device_and_backend(
    environ: Mapping[str, str], placement: DistEnv, visible: int, why_no_gpu: Callable[..., str]
) -> tuple[str, str]:
    device = _device(environ, placement.local_rank, visible, why_no_gpu)
    backend = environ.get("HPCDDP_BACKEND") or ("nccl" if device.startswith("cuda") else "gloo")
    if backend not in BACKENDS:
        raise LaunchError(
            f"HPCDDP_BACKEND={backend!r} is not one of {BACKENDS}. "
            "HINT: unset it to choose automatically."
        )
    check_backend(backend, device, "HPCDDP_BACKEND" if "HPCDDP_BACKEND" in environ else "")
    if backend == "nccl":
        _check_gpu_per_rank(placement, visible)
    return device, backend


def check_backend(backend: str, device: str, chosen_by: str) -> None:
    """Refuse NCCL on a CPU rank here: init_process_group would fail with a C++ trace.

    ``chosen_by`` names the setting that asked for it (``HPCDDP_BACKEND``, ``dist.backend``).
    """
    if backend != "nccl" or device.startswith("cuda"):
        return
    raise LaunchError(
        f"{chosen_by or 'the backend'}=nccl needs CUDA, but this rank runs on {device}. "
        f"HINT: {'unset ' + chosen_by if chosen_by else 'choose gloo'} (gloo is used on CPU), "
        "or request GPUs (--gpus-per-node) so the rank gets a cuda device."
    )


def place(
    environ: Mapping[str, str] | None = None,
    *,
    cuda_devices: Callable[[], int] | None = None,
    devices: Table | None = None,
    hostname: str | None = None,
    ancestors: Callable[[], Sequence[int]] = leftovers.ancestor_pids,
    why_no_gpu: Callable[[Mapping[str, str]], str] = gpus.why_no_gpu,
) -> tuple[DistEnv, LaunchError | None]:
    """This process's place in the job, and its own reason not to run, if it has one.

    A rank that knows its place but cannot use its device (a node without the GPUs the others
    have, say) still knows where the others meet: it tells them at the rendezvous, so every
    rank stops at once instead of waiting for it. Without a place there is no one to tell, so
    that raises here.
    """
    environ = os.environ if environ is None else environ
    placement = _place(environ, ancestors)
    table = _table(cuda_devices, devices)
    placement = dataclasses.replace(
        placement, hostname=hostname or socket.gethostname(), environ=dict(environ), gpus=table
    )
    try:
        device, backend = _device_and_backend(environ, placement, len(table), why_no_gpu)
    except LaunchError as refusal:
        return placement, refusal
    return dataclasses.replace(placement, device=device, backend=backend), None


def resolve_env(
    environ: Mapping[str, str] | None = None,
    *,
    cuda_devices: Callable[[], int] | None = None,
    devices: Table | None = None,
    hostname: str | None = None,
    ancestors: Callable[[], Sequence[int]] = leftovers.ancestor_pids,
    why_no_gpu: Callable[[Mapping[str, str]], str] = gpus.why_no_gpu,
) -> DistEnv:
    """Resolve this process's place in the job from its environment (``os.environ`` by default).

    ``HPCDDP_DEVICE`` (``cpu``, ``cuda`` for the usual GPU choice, or ``cuda:N``) and
    ``HPCDDP_BACKEND`` (``gloo``/``nccl``) override the automatic choice of nccl on CUDA and
    gloo otherwise. The GPUs come from ``devices`` (a table: index, UUID, name, PCI bus id),
    else ``cuda_devices`` (a count, without UUIDs), else torch.
    """
    env, refusal = place(
        environ,
        cuda_devices=cuda_devices,
        devices=devices,
        hostname=hostname,
        ancestors=ancestors,
        why_no_gpu=why_no_gpu,
    )
    if refusal is not None:
        raise refusal
    return env
