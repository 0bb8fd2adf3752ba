"""``--cpus-per-task`` when the config leaves it to hpcddp (``slurm.cpus_per_task: 0``).

A CPU job gets one CPU per rank, as Slurm would give. A GPU rank left with one CPU starves its
GPU: its loader workers and its host-side work share a single core. So a GPU job asks for the
node's cores over its GPUs (a rank per GPU gets its GPU's share of the node), at most
`MOST_PER_RANK`, for the smallest GPU node of the partition, which ``sinfo`` describes.
"""

import dataclasses
import re
import subprocess
from collections.abc import Callable, Sequence

from hpcddp.config.sections import SlurmConfig

MOST_PER_RANK = 16  # loaders rarely use more; asking for more only makes the job harder to place
UNKNOWN_NODE_PER_RANK = 4  # no sinfo to ask (a dry run away from the cluster)
_GPUS = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")  # gpu:4, gpu:a100:4, gpu:a100:4(S:0-1)


@dataclasses.dataclass(frozen=True)
class NodeShape:
    """One node as sinfo describes it: its CPUs and its GPUs."""

    cpus: int
    gpus: int


def parse_sinfo(text: str, partition: str) -> list[NodeShape]:
    """Nodes from ``sinfo -h -N -o '%c %G %P'`` lines in ``partition`` (empty: the default one,
    which sinfo marks with ``*``)."""
    shapes = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or not fields[0].isdigit():
            continue
        part = fields[2]
        wanted = part.rstrip("*") == partition if partition else part.endswith("*")
        if not wanted:
            continue
        gpus = sum(int(n) for n in _GPUS.findall(fields[1]))
        shapes.append(NodeShape(int(fields[0]), gpus))
    return shapes


def node_shapes(
    partition: str, run: Callable[..., "subprocess.CompletedProcess[str]"] | None = None
) -> list[NodeShape]:
    """The partition's nodes, from sinfo (none when sinfo is missing or does not answer)."""
    run = run or subprocess.run
    try:
        done = run(
            ["sinfo", "-h", "-N", "-o", "%c %G %P"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_sinfo(done.stdout, partition) if done.returncode == 0 else []


def per_rank(slurm: SlurmConfig, shapes: Sequence[NodeShape]) -> int:
    """CPUs per rank: the config's, else 1 on CPU, else the smallest GPU node's per-GPU share."""
    if slurm.cpus_per_task > 0:
        return slurm.cpus_per_task
    if slurm.gpus_per_node <= 0:
        return 1
    gpu_nodes = [s for s in shapes if s.gpus > 0]
    if not gpu_nodes:
        return UNKNOWN_NODE_PER_RANK
    share = min(s.cpus // max(s.gpus, slurm.tasks_per_node) for s in gpu_nodes)
    return max(min(share, MOST_PER_RANK), 1)


def no_nodes(partition: str) -> list[NodeShape]:
    """Nothing known about the nodes (rendering away from the cluster, tests)."""
    return []


def with_cpus(
    slurm: SlurmConfig, shapes: Callable[[str], Sequence[NodeShape]] = no_nodes
) -> SlurmConfig:
    """The slurm section with ``cpus_per_task`` decided; ``shapes`` (`node_shapes` asks sinfo)
    is called only for a GPU job that leaves it to hpcddp."""
    if slurm.cpus_per_task > 0:
        return slurm
    known = shapes(slurm.partition) if slurm.gpus_per_node > 0 else []
    return dataclasses.replace(slurm, cpus_per_task=per_rank(slurm, known))
