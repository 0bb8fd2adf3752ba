"""A GPU rank's CPUs: the cores nearest its GPU, and how many loader workers they allow.

A GPU's host-to-device copies, and the loader workers that feed them, run fastest on the
cores of the GPU's own NUMA node (the socket its PCI root hangs off); a rank left on every core
Slurm gave the task crosses the socket link for each batch. The kernel says where each GPU
sits: ``/sys/bus/pci/devices/<bus id>/numa_node``, and which cores a node has:
``/sys/devices/system/node/node<N>/cpulist``. ``sysfs`` is a parameter so tests hand in a tree.
"""

import dataclasses
import os
import pathlib
from collections.abc import Mapping, Set

from hpcddp.launch.distenv import DistEnv
from hpcddp.launch.gpus import Gpu
from hpcddp.launch.resolve import cpus_for_this_rank

SYSFS = pathlib.Path("/sys")


def parse_cpulist(text: str) -> set[int]:
    """``0-3,8-11`` (the kernel's list format) as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def format_cpulist(cpus: Set[int]) -> str:
    """The kernel's list format back: {0, 1, 2, 3, 8} -> ``0-3,8``."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def numa_node_of(bus_id: str, sysfs: pathlib.Path = SYSFS) -> int | None:
    """The NUMA node sysfs gives a PCI device (None when unknown: -1, no file, no bus id)."""
    if not bus_id:
        return None
    try:
        node = int((sysfs / "bus/pci/devices" / bus_id.lower() / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def node_cpus(node: int, sysfs: pathlib.Path = SYSFS) -> set[int]:
    """The CPUs of NUMA node ``node`` (empty when sysfs does not say)."""
    try:
        return parse_cpulist((sysfs / f"devices/system/node/node{node}/cpulist").read_text())
    except (OSError, ValueError):
        return set()


@dataclasses.dataclass(frozen=True)
class Pinning:
    """The CPUs a rank is to run on, and why (for its log and `hpcddp check`)."""

    cpus: frozenset[int]
    numa_node: int | None  # its GPU's NUMA node; None when the rank is left as it was
    reason: str


def near_gpu(gpu: Gpu, allowed: Set[int], sysfs: pathlib.Path = SYSFS) -> Pinning:
    """The cores of ``gpu``'s NUMA node that the rank may use, else the rank's CPUs unchanged.

    Only ever narrows what Slurm (or the user's taskset) allowed: pinning outside it would fail,
    and a GPU whose node has none of the allowed cores keeps them all.
    """
    node = numa_node_of(gpu.bus_id, sysfs)
    if node is None:
        where = gpu.bus_id or "its GPU"
        return Pinning(frozenset(allowed), None, f"the NUMA node of {where} is unknown")
    near = node_cpus(node, sysfs) & set(allowed)
    if not near:
        return Pinning(frozenset(allowed), None, f"none of its CPUs is on NUMA node {node}")
    return Pinning(frozenset(near), node, f"NUMA node {node} of its GPU {gpu.uuid[:12]}")


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (Slurm's binding, a cgroup, taskset)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def pin(pinning: Pinning, force: bool = False) -> None:
    """Run this process (and the loader workers it starts later) on ``pinning.cpus``: when it
    found the GPU's NUMA node, or with ``force`` (putting a process back as it was)."""
    if (force or pinning.numa_node is not None) and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, pinning.cpus)


def ranks_sharing(env: DistEnv, allowed: Set[int], sysfs: pathlib.Path = SYSFS) -> int:
    """How many ranks share the CPUs ``allowed``: 1 for a Slurm task (its own binding); for the
    one task torchrun and local launches run a node's ranks in, all of them, unless the rank
    is already pinned to its GPU's NUMA node (`near_gpu`): then only the ranks whose GPUs sit
    on that node (the node's share of the local ranks), not every local rank again."""
    ranks = max(env.local_world_size, 1)
    if env.launcher == "slurm":
        return 1
    gpu = env.gpu
    node = numa_node_of(gpu.bus_id, sysfs) if gpu is not None else None
    if node is None or not set(allowed) <= node_cpus(node, sysfs):
        return ranks
    on_node = sum(1 for g in env.gpus if numa_node_of(g.bus_id, sysfs) == node)
    return max(-(-ranks * on_node // len(env.gpus)), 1)


def cpus_given(
    env: DistEnv, environ: Mapping[str, str], allowed: Set[int], sysfs: pathlib.Path = SYSFS
) -> int:
    """How many CPUs this rank has to itself: those it may run on, shared with the ranks of its
    task that run on them (`ranks_sharing`), and never more than its share of
    ``--cpus-per-task`` (`cpus_for_this_rank`)."""
    own = max(len(allowed) // ranks_sharing(env, allowed, sysfs), 1)
    slurm = cpus_for_this_rank(env, environ)
    return min(own, slurm) if slurm is not None else own


def default_workers(
    env: DistEnv, environ: Mapping[str, str], allowed: Set[int], sysfs: pathlib.Path = SYSFS
) -> int:
    """DataLoader workers per rank: its CPUs minus the one the training process itself uses."""
    return max(cpus_given(env, environ, allowed, sysfs) - 1, 0)
