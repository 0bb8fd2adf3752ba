"""Which GPU each rank uses: the GPUs a process sees, and one rule that spreads ranks over them.

Counting visible GPUs cannot tell Slurm's layouts apart: under ``--gpu-bind=closest`` a task
sees its socket's 2 of the node's 4 GPUs (valid), under ``--gpus-per-node=1`` four tasks see
the same one GPU (two ranks on one GPU: NCCL's "Duplicate GPU detected"). Device UUIDs can
(MIG instances have their own), so every rank reports its GPUs' UUIDs and PCI bus ids at the
rendezvous and `assign` decides there, for all of them at once. NCCL itself tells GPUs apart
by host and bus id, so MIG instances of one GPU are one GPU to it (`device_key`). torch is
imported only inside `visible_gpus`.
"""

import collections
import dataclasses
import os
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU as this process numbers it (its index under CUDA_VISIBLE_DEVICES)."""

    index: int
    uuid: str  # "GPU-..." or "MIG-...": the same device has the same UUID in every process
    name: str = ""
    bus_id: str = ""  # PCI address, "0000:3b:00.0": where sysfs keeps its NUMA node


@dataclasses.dataclass(frozen=True)
class View:
    """One rank's view at the rendezvous: where it is, what it sees, what it chose alone."""

    rank: int
    host: str
    local_rank: int
    gpus: tuple[Gpu, ...]
    index: int | None  # the CUDA index it chose alone; None on CPU
    explicit: bool = False  # HPCDDP_DEVICE=cuda:N: the user's choice is kept, only checked


def _uuid(props: object) -> str:
    """torch gives the bare UUID; nvidia-smi -L and CUDA_VISIBLE_DEVICES write ``GPU-<uuid>``,
    and ``MIG-<uuid>`` for a MIG instance (whose name torch gives as ``... MIG 3g.20gb``)."""
    text = str(getattr(props, "uuid", "") or "")
    if not text or text.startswith(("GPU-", "MIG-")):
        return text
    mig = " MIG " in f" {getattr(props, 'name', '')} "
    return f"{'MIG' if mig else 'GPU'}-{text}"


def _bus_id(props: object) -> str:
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return ""
    domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


# The device files through which torch reaches a GPU: NVIDIA's driver's, ROCm's (torch.cuda
# runs on HIP there) and WSL's. On a machine with none of them, no torch can see a GPU.
GPU_DEVICE_FILES = ("nvidia", "kfd", "dxg")


def visible_gpus(dev: str = "/dev") -> tuple[Gpu, ...]:
    """The GPUs this process sees, in CUDA's order (none without torch or CUDA). On a machine
    without GPU device files torch is not asked: importing it costs 1.5 CPU-s, and a login
    node's ``hpcddp env`` would pay that to learn there is none."""
    if not has_gpu_device_files(dev):
        return ()
    try:
        import torch
    except ImportError:
        return ()
    if not torch.cuda.is_available():
        return ()
    table = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        table.append(Gpu(index, _uuid(props), props.name, _bus_id(props)))
    return tuple(table)


def counted(count: int) -> tuple[Gpu, ...]:
    """A table from a bare count (no UUIDs: such ranks are spread but cannot be checked)."""
    return tuple(Gpu(index, "") for index in range(count))


# -- what Slurm gave, and why a rank may see none of it ----------------------------------------


def slurm_gave_gpus(environ: Mapping[str, str]) -> str:
    """The variable that says Slurm gave this job GPUs on this node (empty when none did)."""
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if environ.get(name, "").strip():
            return f"{name}={environ[name]}"
    on_node = environ.get("SLURM_GPUS_ON_NODE", "")
    return f"SLURM_GPUS_ON_NODE={on_node}" if on_node.isdigit() and int(on_node) > 0 else ""


def container_of(environ: Mapping[str, str]) -> str:
    """The container runtime this process runs in, if any (apptainer, singularity, pyxis)."""
    for name, runtime in (
        ("APPTAINER_CONTAINER", "apptainer"),
        ("SINGULARITY_CONTAINER", "singularity"),
        ("ENROOT_ROOTFS", "pyxis"),
    ):
        if environ.get(name):
            return runtime
    return ""


def no_gpu_reason(environ: Mapping[str, str], torch_cuda: str | None, device_files: bool) -> str:
    """One line: Slurm gave GPUs, this rank sees none through torch, why, and the fix.

    ``torch_cuda`` is torch's CUDA version (None for a CPU-only wheel); ``device_files`` says
    whether /dev/nvidia* exists here (a container started without its GPU option has none).
    """
    given = slurm_gave_gpus(environ)
    runtime = container_of(environ)
    if torch_cuda is None:
        why = (
            "this torch is a CPU-only build (torch.version.cuda is None). HINT: install a CUDA "
            "wheel (pip install torch --index-url https://download.pytorch.org/whl/cu124), or "
            "use an image that has one"
        )
    elif runtime and not device_files:
        flag = "--container-env=NVIDIA_VISIBLE_DEVICES" if runtime == "pyxis" else "--nv"
        why = (
            f"it runs in a {runtime} container without the GPUs (no /dev/nvidia*; {flag} "
            "missing). HINT: let hpcddp's job script start the container (it adds the GPU "
            f"option whenever Slurm gives GPUs), or add {flag} yourself"
        )
    else:
        why = (
            f"CUDA {torch_cuda} cannot use them (driver missing or too old for this torch?). "
            "HINT: run nvidia-smi on that node, and install a torch built for its driver"
        )
    return (
        f"Slurm gave this job GPUs ({given}) but this rank sees none through torch, so it "
        f"would train on CPU: {why}; or set HPCDDP_DEVICE=cpu to train on CPU on purpose."
    )


def why_no_gpu(environ: Mapping[str, str]) -> str:
    """`no_gpu_reason` for this process."""
    try:
        import torch

        torch_cuda = torch.version.cuda
    except ImportError:
        torch_cuda = None
    return no_gpu_reason(environ, torch_cuda, has_gpu_device_files("/dev", ("nvidia",)))


def has_gpu_device_files(dev: str = "/dev", prefixes: tuple[str, ...] = GPU_DEVICE_FILES) -> bool:
    """Whether ``dev`` holds a GPU driver's device files (``nvidia0``, ``nvidiactl``, ``kfd``)."""
    try:
        return any(name.startswith(prefixes) for name in os.listdir(dev))
    except OSError:
        return False


# -- the rule ----------------------------------------------------------------------------------


def assign(views: Sequence[View]) -> dict[int, int]:
    """Each GPU rank's CUDA index: ranks of a host that see the same GPUs take distinct ones in
    local-rank order (the first sees the group's first GPU, and so on, wrapping around when
    there are more ranks than GPUs, which `shared` then refuses). Explicit choices are kept.

    A rank's own guess (``local_rank % visible``) is wrong under ``--gpu-bind=closest`` with a
    cyclic task distribution: local ranks 0 and 2 share a socket, and both would take its first.
    """
    groups: dict[tuple[str, tuple[str, ...]], list[View]] = collections.defaultdict(list)
    chosen: dict[int, int] = {}
    for view in sorted(views, key=lambda v: (v.host, v.local_rank, v.rank)):
        if view.index is None:
            continue
        if view.explicit or not all(g.uuid for g in view.gpus):
            chosen[view.rank] = view.index
        else:
            groups[(view.host, tuple(sorted(g.uuid for g in view.gpus)))].append(view)
    for members in groups.values():
        order = [g.uuid for g in members[0].gpus]  # the group's first rank's CUDA order
        for position, view in enumerate(members):
            wanted = order[position % len(order)]
            chosen[view.rank] = next(g.index for g in view.gpus if g.uuid == wanted)
    return chosen


def device_key(host: str, gpu: Gpu, physical: bool) -> str:
    """What makes two ranks' GPUs one device: its UUID, or with ``physical`` the host and PCI
    bus id, as NCCL compares them (MIG instances of one GPU have UUIDs of their own and one
    bus id; NCCL refuses two ranks on them as on one GPU)."""
    if physical and gpu.bus_id:
        return f"{host}/{gpu.bus_id.lower()}"
    return gpu.uuid


def shared(
    views: Sequence[View], chosen: Mapping[int, int], physical: bool = False
) -> list[tuple[Gpu, list[View]]]:
    """Every GPU that more than one rank would use (by `device_key`), with those ranks."""
    users: dict[str, list[View]] = collections.defaultdict(list)
    devices: dict[str, Gpu] = {}
    for view in sorted(views, key=lambda v: v.rank):
        index = chosen.get(view.rank)
        gpu = next((g for g in view.gpus if g.index == index), None)
        if gpu is not None and gpu.uuid:
            key = device_key(view.host, gpu, physical)
            users[key].append(view)
            devices.setdefault(key, gpu)
    return [(devices[key], who) for key, who in users.items() if len(who) > 1]


def sharing_message(gpu: Gpu, who: Sequence[View]) -> str:
    """One line: which ranks on which host would share which GPU, and the fix."""
    ranks = ", ".join(str(v.rank) for v in who)
    name = f" ({gpu.name})" if gpu.name else ""
    what = f"GPU {gpu.uuid}{name}"
    if gpu.uuid.startswith("MIG-") and gpu.bus_id:
        what = f"the GPU at bus {gpu.bus_id}{name} (its MIG instances are one GPU to NCCL)"
    return (
        f"ranks {ranks} on {who[0].host} would all use {what}: NCCL refuses two ranks on one "
        'GPU ("Duplicate GPU detected"). HINT: give each rank its own GPU (--gpus-per-task=1, '
        "or --gpus-per-node equal to --ntasks-per-node; map_gpu with distinct GPUs), or start "
        "fewer tasks per node."
    )


def describe(gpu: Gpu | None) -> str:
    """``cuda:1 GPU-5f2b0c3e 0000:3b:00.0`` for logs and `hpcddp check` (``-`` on CPU): the
    UUID tells MIG instances apart, the bus id the physical GPU they are cut from."""
    if gpu is None:
        return "-"
    return " ".join(part for part in (f"cuda:{gpu.index}", gpu.uuid[:12], gpu.bus_id) if part)
