"""`DistEnv`: one process's place in the job, as every later layer receives it.

A frozen value, built once by `hpcddp.launch.resolve.resolve_env` and passed down (never read
back from globals), so the process group, the trainer and the logs all see the same facts.
The environment it was resolved from travels with it (`DistEnv.environ`): the few rank-side
readers that need more than the place (the job's end time, the requeue, the attempt's restart
count) read that mapping, never ``os.environ``.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from hpcddp.launch.gpus import Gpu


@dataclasses.dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job, and how it reaches the others."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    launcher: str
    job_id: str
    # chosen after the launch context has placed the process (see `resolve_env`)
    hostname: str = ""
    device: str = "cpu"
    backend: str = "gloo"
    # the environment this place was resolved from (empty when built by hand: no Slurm job)
    environ: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    gpus: tuple[Gpu, ...] = ()  # the GPUs this process sees, in CUDA's order

    @property
    def slurm_job(self) -> str:
        """The Slurm job id that a requeue keeps ("" outside Slurm)."""
        return self.environ.get("SLURM_JOB_ID", "")

    @property
    def restart_count(self) -> int:
        """How often Slurm has requeued this job (SLURM_RESTART_COUNT; 0 outside Slurm)."""
        return int(self.environ.get("SLURM_RESTART_COUNT", "0") or 0)

    def facts(self) -> dict[str, Any]:
        """The resolved place as plain values (``hpcddp env``), the environment left out."""
        plain = dataclasses.asdict(self)
        return {f.name: plain[f.name] for f in dataclasses.fields(self) if f.compare}

    @property
    def gpu(self) -> Gpu | None:
        """The GPU this rank uses (None on CPU)."""
        if not self.device.startswith("cuda:"):
            return None
        index = int(self.device.partition(":")[2])
        return next((g for g in self.gpus if g.index == index), None)

    @property
    def is_main(self) -> bool:
        """True on the one process that writes files and prints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when there is more than one process to talk to."""
        return self.world_size > 1

    def torch_env(self) -> dict[str, str]:
        """The ``env://`` variables torch.distributed reads, as strings."""
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
