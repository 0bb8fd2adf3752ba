"""Turn a launcher's view (torchrun, a Slurm step, a local launch) into torch.distributed's.

Every rank resolves alone from its own environment, so the rules must be exact: a guessed
rank or a ``localhost`` master makes every node train alone, or hangs init forever. Each
launch context is one small class with ``detect`` and ``resolve``; `resolve_env` tries them
in the order of `CONTEXTS`. The environment is read here only, as a mapping passed in.
"""

import dataclasses
import os
import re
import socket
from collections.abc import Callable, Mapping

from hpcddp import hostlist
from hpcddp.errors import HostlistError, LaunchError
from hpcddp.ports import derive_port

BACKENDS = ("gloo", "nccl")


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


def _int(environ: Mapping[str, str], name: str, context: str) -> int:
    """Read an integer variable, or explain which one is missing or malformed."""
    value = environ.get(name)
    if value is None or value == "":
        raise LaunchError(
            f"{context}: {name} is not set. HINT: {_HINTS[context]}"
        )
    try:
        return int(value)
    except ValueError:
        raise LaunchError(
            f"{context}: {name}={value!r} is not an integer. HINT: {_HINTS[context]}"
        ) from None


_HINTS = {
    "torchrun": "launch with `torchrun --nnodes=N --nproc-per-node=K ...`, which sets RANK, "
    "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT together.",
    "slurm": "run one task per rank inside a job step: `srun hpcddp train ...` "
    "(in sbatch/train.sh this is done for you).",
    "local": "use `hpcddp train --nproc N`, which starts and numbers the local processes.",
    "single": "launch through `srun` (one task per rank) or `hpcddp train --nproc N`.",
}


def _explicit_master(environ: Mapping[str, str], context: str) -> tuple[str | None, int | None]:
    """An explicit MASTER_ADDR / MASTER_PORT wins over anything derived."""
    addr = environ.get("MASTER_ADDR") or None
    port = _int(environ, "MASTER_PORT", context) if environ.get("MASTER_PORT") else None
    if port is not None and not 0 < port < 65536:
        raise LaunchError(f"{context}: MASTER_PORT={port} is not a TCP port. "
                          "HINT: choose a free port in 1024-32767.")
    return addr, port


class TorchrunContext:
    """torchrun (or any launcher speaking its variables); wins even inside a Slurm job."""

    name = "torchrun"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """torchrun sets TORCHELASTIC_RUN_ID; torchrun-alikes set RANK and WORLD_SIZE."""
        return "TORCHELASTIC_RUN_ID" in environ or (
            "RANK" in environ and "WORLD_SIZE" in environ
        )

    @staticmethod
    def resolve(environ: Mapping[str, str]) -> DistEnv:
        """Read torchrun's variables as they are; it already agreed on them."""
        rank = _int(environ, "RANK", "torchrun")
        world_size = _int(environ, "WORLD_SIZE", "torchrun")
        local_rank = _int(environ, "LOCAL_RANK", "torchrun")
        local_world = _int(environ, "LOCAL_WORLD_SIZE", "torchrun")
        addr, port = _explicit_master(environ, "torchrun")
        if addr is None or port is None:
            raise LaunchError(
                "torchrun: MASTER_ADDR and MASTER_PORT must both be set next to RANK="
                f"{rank} and WORLD_SIZE={world_size}. HINT: {_HINTS['torchrun']}"
            )
        node_rank = (_int(environ, "GROUP_RANK", "torchrun") if environ.get("GROUP_RANK")
                     else rank // max(local_world, 1))
        return DistEnv(
            rank=rank, local_rank=local_rank, world_size=world_size,
            local_world_size=local_world, node_rank=node_rank,
            num_nodes=-(-world_size // max(local_world, 1)), master_addr=addr,
            master_port=port, launcher="torchrun",
            job_id=environ.get("SLURM_JOB_ID") or environ.get("TORCHELASTIC_RUN_ID", ""),
        )


class SlurmStepContext:
    """One task of an ``srun`` step: the step-scoped variables describe the world."""

    name = "slurm"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """Only a step makes a process one rank of N; the batch shell is not a rank."""
        return "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ

    @staticmethod
    def resolve(environ: Mapping[str, str]) -> DistEnv:
        """Read the step's geometry and check that it describes one consistent world."""
        rank = _int(environ, "SLURM_PROCID", "slurm")
        world_size = _int(environ, "SLURM_STEP_NUM_TASKS", "slurm")
        local_rank = _int(environ, "SLURM_LOCALID", "slurm")
        node_rank = _int(environ, "SLURM_NODEID", "slurm")
        nodes = _step_nodes(environ)
        per_node = parse_tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE", ""))
        _check_step_geometry(world_size, nodes, per_node, node_rank)
        addr, port = _explicit_master(environ, "slurm")
        if addr is None and rank == 0:
            _check_rank0_on_first_host(nodes, node_rank)
        job_id = environ.get("SLURM_JOB_ID", "")
        if port is None:
            port = derive_port(job_id, environ.get("SLURM_STEP_ID", "0"),
                               environ.get("SLURM_ARRAY_TASK_ID", ""))
        return DistEnv(
            rank=rank, local_rank=local_rank, world_size=world_size,
            local_world_size=per_node[node_rank], node_rank=node_rank,
            num_nodes=len(nodes), master_addr=addr or nodes[0], master_port=port,
            launcher="slurm", job_id=job_id,
        )


def _step_nodes(environ: Mapping[str, str]) -> list[str]:
    """The step's hosts in node-id order; rank 0 runs on the first under block distribution."""
    expr = environ.get("SLURM_STEP_NODELIST", "")
    if not expr:
        raise LaunchError(f"slurm: SLURM_STEP_NODELIST is not set. HINT: {_HINTS['slurm']}")
    try:
        return hostlist.expand(expr)
    except HostlistError as err:
        raise LaunchError(f"slurm: SLURM_STEP_NODELIST={expr!r}: {err}") from None


def _check_rank0_on_first_host(nodes: list[str], node_rank: int) -> None:
    """The derived master is the step's first host: only rank 0 can tell if it runs elsewhere."""
    if node_rank != 0:
        raise LaunchError(
            f"slurm: rank 0 runs on node {node_rank} ({nodes[node_rank]}) of the step, not on "
            f"its first host {nodes[0]}, where the other ranks will look for it (arbitrary "
            "distribution or SLURM_HOSTFILE?). HINT: use --distribution=block or cyclic, or "
            "export MASTER_ADDR=<host of rank 0>.")


def _check_step_geometry(world: int, nodes: list[str], per_node: list[int], node: int) -> None:
    """Refuse a step whose numbers disagree instead of hanging at init."""
    if len(per_node) != len(nodes):
        raise LaunchError(
            f"slurm: SLURM_STEP_TASKS_PER_NODE lists {len(per_node)} nodes but "
            f"SLURM_STEP_NODELIST has {len(nodes)}. HINT: {_HINTS['slurm']}")
    if sum(per_node) != world:
        raise LaunchError(
            f"slurm: SLURM_STEP_TASKS_PER_NODE adds up to {sum(per_node)} tasks but "
            f"SLURM_STEP_NUM_TASKS={world}. HINT: {_HINTS['slurm']}")
    if not 0 <= node < len(nodes):
        raise LaunchError(f"slurm: SLURM_NODEID={node} is not below the step's "
                          f"{len(nodes)} nodes. HINT: {_HINTS['slurm']}")


_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(text: str) -> list[int]:
    """Expand Slurm's compressed task counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in text.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if not match:
            raise LaunchError(
                f"slurm: cannot read tasks per node {text!r} (bad part {item!r}); expected "
                f"a form like '2(x3),1'. HINT: {_HINTS['slurm']}")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


class LocalContext:
    """Processes started on this one host by ``hpcddp train --nproc`` or submitit's local executor."""

    name = "local"
    # Each local launcher names the same facts differently; one table per launcher.
    TABLES = (
        {"rank": "HPCDDP_LOCAL_RANK", "world": "HPCDDP_LOCAL_WORLD_SIZE", "job": "HPCDDP_LOCAL_JOB_ID"},
        {"rank": "SUBMITIT_LOCAL_GLOBALID", "world": "SUBMITIT_LOCAL_NTASKS",
         "job": "SUBMITIT_LOCAL_JOB_ID"},
    )

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """A local launcher numbered this process."""
        return any(table["rank"] in environ for table in cls.TABLES)

    @classmethod
    def resolve(cls, environ: Mapping[str, str]) -> DistEnv:
        """All processes share this host, so the loopback address is a fact, not a guess."""
        table = next(t for t in cls.TABLES if t["rank"] in environ)
        rank = _int(environ, table["rank"], "local")
        world = _int(environ, table["world"], "local")
        job_id = environ.get(table["job"], "")
        addr, port = _explicit_master(environ, "local")
        return DistEnv(
            rank=rank, local_rank=rank, world_size=world, local_world_size=world,
            node_rank=0, num_nodes=1, master_addr=addr or "127.0.0.1",
            master_port=port or derive_port(job_id or "local"), launcher="local",
            job_id=job_id,
        )


class SingleContext:
    """A plain ``python``/``hpcddp`` process: world of one, unless Slurm says otherwise."""

    name = "single"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """The fallback: always applies when nothing above did."""
        return True

    @staticmethod
    def resolve(environ: Mapping[str, str]) -> DistEnv:
        """Refuse to pretend a many-task batch or salloc shell is one rank of one."""
        ntasks = environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS") or "1"
        if ntasks != "1":
            raise LaunchError(
                f"single: this shell is in Slurm job {environ.get('SLURM_JOB_ID', '?')} with "
                f"SLURM_NTASKS={ntasks} but no job step (SLURM_STEP_ID unset), so it is not one "
                f"of the job's ranks. HINT: {_HINTS['slurm']}")
        addr, port = _explicit_master(environ, "single")
        job_id = environ.get("SLURM_JOB_ID", "")
        return DistEnv(
            rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
            num_nodes=1, master_addr=addr or "127.0.0.1",
            master_port=port or derive_port(job_id or "single"), launcher="single",
            job_id=job_id,
        )


# Detection order matters: torchrun can run inside a Slurm step (`srun torchrun ...`), and a
# Slurm step can run inside a local launch's environment; the fallback comes last.
CONTEXTS = (TorchrunContext, SlurmStepContext, LocalContext, SingleContext)


def visible_cuda_devices() -> int:
    """How many GPUs this process can see (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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


def _device(environ: Mapping[str, str], local_rank: int,
            cuda_devices: Callable[[], int]) -> tuple[str, int]:
    """This rank's device and the GPU count it was chosen from (0 when none was counted).

    ``HPCDDP_DEVICE=cuda`` without an index means "CUDA, the usual choice of index", not
    ``cuda:0`` for every rank; an explicit device such as ``cpu`` or ``cuda:1`` is taken as is.
    """
    wanted = environ.get("HPCDDP_DEVICE")
    if wanted and wanted != "cuda":
        return wanted, 0
    visible = cuda_devices()
    if wanted == "cuda" and visible <= 0:
        raise LaunchError("HPCDDP_DEVICE=cuda but this process sees no GPU. HINT: request GPUs "
                          "(--gpus-per-node), check CUDA_VISIBLE_DEVICES, or unset HPCDDP_DEVICE.")
    return choose_device(local_rank, visible), visible


def _check_gpu_per_rank(p: DistEnv, visible: int, environ: Mapping[str, str]) -> None:
    """Refuse a node with more NCCL ranks than GPUs: two ranks on one GPU hang NCCL.

    Ranks that share one task (torchrun, a local launch) see the same GPUs, so fewer GPUs than
    ranks means sharing. A Slurm task may instead be bound to GPUs of its own: one visible GPU,
    or ``--gpus-per-task``, says nothing about its neighbours, so those are let through.
    """
    if not 0 < visible < p.local_world_size:
        return
    if p.launcher == "slurm" and (visible == 1 or environ.get("SLURM_GPUS_PER_TASK")):
        return
    raise LaunchError(
        f"{p.launcher}: {p.local_world_size} ranks on this node but this rank sees only "
        f"{visible} GPU(s), so ranks would share a GPU and NCCL would hang. HINT: request one "
        "GPU per rank (`--gpus-per-task=1`), or start fewer tasks per node.")


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
        raise LaunchError(f"{p.launcher}: inconsistent launch information: "
                          f"{'; '.join(problems)}. HINT: {_HINTS[p.launcher]}")


def resolve_env(
    environ: Mapping[str, str] | None = None,
    *,
    cuda_devices: Callable[[], int] = visible_cuda_devices,
    hostname: str | None = None,
) -> DistEnv:
    """Resolve this process's place in the job from its environment (``os.environ`` by default).

    ``HPCDDP_DEVICE`` (``cpu``, ``cuda`` for the usual GPU choice, or ``cuda:N``) and
    ``HPCDDP_BACKEND`` (``gloo``/``nccl``) override the automatic choice of nccl on CUDA and
    gloo otherwise.
    """
    environ = os.environ if environ is None else environ
    context = next(c for c in CONTEXTS if c.detect(environ))
    placement = context.resolve(environ)
    _check_placement(placement)
    device, visible = _device(environ, placement.local_rank, cuda_devices)
    backend = environ.get("HPCDDP_BACKEND") or ("nccl" if device.startswith("cuda") else "gloo")
    if backend not in BACKENDS:
        raise LaunchError(f"HPCDDP_BACKEND={backend!r} is not one of {BACKENDS}. "
                          "HINT: unset it to choose automatically.")
    if backend == "nccl":
        _check_gpu_per_rank(placement, visible, environ)
    return dataclasses.replace(placement, hostname=hostname or socket.gethostname(),
                               device=device, backend=backend)
