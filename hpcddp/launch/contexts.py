"""The launch contexts: torchrun, a Slurm step, a local launch, a single process.

Each context is one small class with ``detect`` and ``resolve``, reading a mapping passed in
(never ``os.environ`` directly) and returning a `DistEnv` placement; `CONTEXTS` is the order
they are tried in. The rules must be exact: a guessed rank or a ``localhost`` master makes
every node train alone, or hangs init forever.
"""

import pathlib
import re
from collections.abc import Mapping

from hpcddp.errors import HostlistError, LaunchError, agreed
from hpcddp.launch import hostlist, leftovers
from hpcddp.launch.distenv import DistEnv
from hpcddp.launch.ports import derive_port


def _int(environ: Mapping[str, str], name: str, context: str) -> int:
    """Read an integer variable, or explain which one is missing or malformed."""
    value = environ.get(name)
    if value is None or value == "":
        raise LaunchError(f"{context}: {name} is not set. HINT: {HINTS[context]}")
    try:
        return int(value)
    except ValueError:
        raise LaunchError(
            f"{context}: {name}={value!r} is not an integer. HINT: {HINTS[context]}"
        ) from None


HINTS = {
    "torchrun": "launch with `torchrun --nnodes=N --nproc-per-node=K ...`, which sets RANK, "
    "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT together.",
    "slurm": "run one task per rank inside a job step: `srun hpcddp train ...` "
    "(in sbatch/train.sh this is done for you).",
    "local": "use `hpcddp train --nproc N`, which starts and numbers the local processes.",
    "single": "launch through `srun` (one task per rank) or `hpcddp train --nproc N`.",
    "wrapper": "export LOCAL_RANK and LOCAL_WORLD_SIZE in your wrapper as well (torchrun sets "
    "them), or drop RANK and WORLD_SIZE and start one task per rank with srun: hpcddp reads "
    "Slurm's own variables.",
}


def _refuse_loopback_master(addr: str | None, num_nodes: int, context: str) -> None:
    """A loopback MASTER_ADDR (``localhost`` left in a shell) splits a multi-node job in parts."""
    if addr is not None and num_nodes > 1 and leftovers.is_loopback_name(addr):
        raise agreed(
            LaunchError(
                f"{context}: MASTER_ADDR={addr} but this job spans {num_nodes} nodes: every node "
                "would look for the master on itself (an export left in your shell or "
                "~/.bashrc?). HINT: unset MASTER_ADDR (hpcddp then uses the host of rank 0), or "
                "export MASTER_ADDR=<the host of rank 0>."
            )
        )


def _explicit_master(environ: Mapping[str, str], context: str) -> tuple[str | None, int | None]:
    """An explicit MASTER_ADDR / MASTER_PORT wins over anything derived."""
    addr = environ.get("MASTER_ADDR") or None
    port = _int(environ, "MASTER_PORT", context) if environ.get("MASTER_PORT") else None
    if port is not None and not 0 < port < 65536:
        raise LaunchError(
            f"{context}: MASTER_PORT={port} is not a TCP port. "
            "HINT: choose a free port in 1024-32767."
        )
    return addr, port


class TorchrunContext:
    """torchrun (or any launcher speaking its variables); wins even inside a Slurm job."""

    name = "torchrun"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """torchrun sets TORCHELASTIC_RUN_ID; torchrun-alikes set RANK and WORLD_SIZE."""
        return "TORCHELASTIC_RUN_ID" in environ or ("RANK" in environ and "WORLD_SIZE" in environ)

    @staticmethod
    def resolve(environ: Mapping[str, str]) -> DistEnv:
        """Read torchrun's variables as they are; it already agreed on them.

        A wrapper that sets RANK and WORLD_SIZE itself (no TORCHELASTIC_RUN_ID) and only copies
        a Slurm step's numbers is that step: the step's variables give what it left out.
        """
        wrapper = "TORCHELASTIC_RUN_ID" not in environ
        if wrapper and SlurmStepContext.detect(environ) and _mirrors_step(environ):
            return SlurmStepContext.resolve(environ)
        missing = [n for n in ("LOCAL_RANK", "LOCAL_WORLD_SIZE") if not environ.get(n)]
        if wrapper and missing:
            raise LaunchError(
                f"RANK={environ.get('RANK')} and WORLD_SIZE={environ.get('WORLD_SIZE')} are set "
                f"by a launcher that is not torchrun (no TORCHELASTIC_RUN_ID), without "
                f"{' or '.join(missing)}: this process cannot tell how many ranks share its node, "
                f"so neither its GPU nor its CPU share. HINT: {HINTS['wrapper']}"
            )
        rank = _int(environ, "RANK", "torchrun")
        world_size = _int(environ, "WORLD_SIZE", "torchrun")
        local_rank = _int(environ, "LOCAL_RANK", "torchrun")
        local_world = _int(environ, "LOCAL_WORLD_SIZE", "torchrun")
        addr, port = _explicit_master(environ, "torchrun")
        _refuse_loopback_master(addr, -(-world_size // max(local_world, 1)), "torchrun")
        if addr is None or port is None:
            raise LaunchError(
                "torchrun: MASTER_ADDR and MASTER_PORT must both be set next to RANK="
                f"{rank} and WORLD_SIZE={world_size}. HINT: {HINTS['torchrun']}"
            )
        node_rank = (
            _int(environ, "GROUP_RANK", "torchrun")
            if environ.get("GROUP_RANK")
            else rank // max(local_world, 1)
        )
        return DistEnv(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_world,
            node_rank=node_rank,
            num_nodes=-(-world_size // max(local_world, 1)),
            master_addr=addr,
            master_port=port,
            launcher="torchrun",
            job_id=environ.get("SLURM_JOB_ID") or environ.get("TORCHELASTIC_RUN_ID", ""),
        )


def _mirrors_step(environ: Mapping[str, str]) -> bool:
    """RANK and WORLD_SIZE (and LOCAL_RANK, if set) are the step's own numbers."""
    same = environ.get("RANK") == environ.get("SLURM_PROCID") and environ.get(
        "WORLD_SIZE"
    ) == environ.get("SLURM_STEP_NUM_TASKS")
    local = environ.get("LOCAL_RANK")
    return same and (not local or local == environ.get("SLURM_LOCALID"))


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
        _refuse_loopback_master(addr, len(nodes), "slurm")
        first = addr or _rank0_host(environ, nodes)
        if addr is None and rank == 0:
            _check_rank0_on_first_host(nodes, node_rank, first)
        job_id = environ.get("SLURM_JOB_ID", "")
        if port is None:
            port = derive_port(
                job_id, environ.get("SLURM_STEP_ID", "0"), environ.get("SLURM_ARRAY_TASK_ID", "")
            )
        return DistEnv(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=per_node[node_rank],
            node_rank=node_rank,
            num_nodes=len(nodes),
            master_addr=first,
            master_port=port,
            launcher="slurm",
            job_id=job_id,
        )


def _step_nodes(environ: Mapping[str, str]) -> list[str]:
    """The step's hosts in node-id order; rank 0 runs on the first under block distribution."""
    expr = environ.get("SLURM_STEP_NODELIST", "")
    if not expr:
        raise LaunchError(f"slurm: SLURM_STEP_NODELIST is not set. HINT: {HINTS['slurm']}")
    try:
        return hostlist.expand(expr)
    except HostlistError as err:
        raise LaunchError(f"slurm: SLURM_STEP_NODELIST={expr!r}: {err}") from None


def _rank0_host(environ: Mapping[str, str], nodes: list[str]) -> str:
    """Where rank 0 runs: the step's first host, or the hostfile's first line under
    ``--distribution=arbitrary`` (which every task sees, so every rank agrees)."""
    if not environ.get("SLURM_DISTRIBUTION", "").startswith("arbitrary"):
        return nodes[0]
    path = environ.get("SLURM_HOSTFILE", "")
    try:
        lines = pathlib.Path(path).read_text().split("\n") if path else []
        first = next(line.split("#")[0].strip() for line in lines if line.split("#")[0].strip())
        return hostlist.expand(first.split("*")[0])[0]
    except (OSError, StopIteration, HostlistError, IndexError):
        raise agreed(
            LaunchError(
                f"slurm: --distribution=arbitrary places rank 0 on the first host of "
                f"SLURM_HOSTFILE={path or '(unset)'}, which cannot be read here. HINT: put the "
                "hostfile on a file system every node sees, or export MASTER_ADDR=<host of rank 0>."
            )
        ) from None


def _check_rank0_on_first_host(nodes: list[str], node_rank: int, expected: str) -> None:
    """The derived master is where rank 0 should be: only rank 0 can tell if it runs elsewhere."""
    if nodes[node_rank] != expected:
        raise LaunchError(
            f"slurm: rank 0 runs on node {node_rank} ({nodes[node_rank]}) of the step, not on "
            f"{expected}, where the other ranks will look for it (a distribution that moves "
            "rank 0?). HINT: use --distribution=block or cyclic, or "
            "export MASTER_ADDR=<host of rank 0>."
        )


def _check_step_geometry(world: int, nodes: list[str], per_node: list[int], node: int) -> None:
    """Refuse a step whose numbers disagree instead of hanging at init."""
    if len(per_node) != len(nodes):
        raise LaunchError(
            f"slurm: SLURM_STEP_TASKS_PER_NODE lists {len(per_node)} nodes but "
            f"SLURM_STEP_NODELIST has {len(nodes)}. HINT: {HINTS['slurm']}"
        )
    if sum(per_node) != world:
        raise LaunchError(
            f"slurm: SLURM_STEP_TASKS_PER_NODE adds up to {sum(per_node)} tasks but "
            f"SLURM_STEP_NUM_TASKS={world}. HINT: {HINTS['slurm']}"
        )
    if not 0 <= node < len(nodes):
        raise LaunchError(
            f"slurm: SLURM_NODEID={node} is not below the step's "
            f"{len(nodes)} nodes. HINT: {HINTS['slurm']}"
        )


_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(text: str) -> list[int]:
    """Expand Slurm's compressed task counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in text.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if not match:
            raise LaunchError(
                f"slurm: cannot read tasks per node {text!r} (bad part {item!r}); expected "
                f"a form like '2(x3),1'. HINT: {HINTS['slurm']}"
            )
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


class LocalContext:
    """Processes started on this host by ``hpcddp train --nproc`` or submitit's local executor."""

    name = "local"
    # Each local launcher names the same facts differently; one table per launcher.
    TABLES = (
        {
            "rank": "HPCDDP_LOCAL_RANK",
            "world": "HPCDDP_LOCAL_WORLD_SIZE",
            "job": "HPCDDP_LOCAL_JOB_ID",
        },
        {
            "rank": "SUBMITIT_LOCAL_GLOBALID",
            "world": "SUBMITIT_LOCAL_NTASKS",
            "job": "SUBMITIT_LOCAL_JOB_ID",
        },
    )

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """A local launcher numbered this process."""
        return any(table["rank"] in environ for table in cls.TABLES)

    @classmethod
    def resolve(cls, environ: Mapping[str, str]) -> DistEnv:
        """All processes share this host, so the loopback address is a fact, not a guess.

        The local launcher started this process, so its numbering wins over an ``srun`` step
        around it; but a step of several tasks would start one local world per task.
        """
        table = next(t for t in cls.TABLES if t["rank"] in environ)
        step_tasks = environ.get("SLURM_STEP_NUM_TASKS", "1")
        if "SLURM_STEP_ID" in environ and step_tasks not in ("", "1"):
            raise agreed(
                LaunchError(
                    f"local: a local launcher ({table['rank'].rsplit('_', 1)[0]}_*) runs inside "
                    f"task {environ.get('SLURM_PROCID', '?')} of an srun step of {step_tasks} "
                    "tasks: each task starts its own local world and all their ranks 0 collide. "
                    "HINT: start one task (srun -n1 ...), or submit to Slurm directly "
                    "(cluster='slurm') so that Slurm starts one task per rank."
                )
            )
        rank = _int(environ, table["rank"], "local")
        world = _int(environ, table["world"], "local")
        job_id = environ.get(table["job"], "")
        addr, port = _explicit_master(environ, "local")
        return DistEnv(
            rank=rank,
            local_rank=rank,
            world_size=world,
            local_world_size=world,
            node_rank=0,
            num_nodes=1,
            master_addr=addr or "127.0.0.1",
            master_port=port or derive_port(job_id or "local"),
            launcher="local",
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
        """Refuse to pretend a many-task batch or salloc shell, or half a launcher's
        environment, is one rank of one."""
        partial = leftovers.partial_set(environ)
        if partial:
            raise LaunchError(f"single: {leftovers.partial_message(environ, partial)}")
        ntasks = environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS") or "1"
        if ntasks != "1":
            raise LaunchError(
                f"single: this shell is in Slurm job {environ.get('SLURM_JOB_ID', '?')} with "
                f"SLURM_NTASKS={ntasks} but no job step (SLURM_STEP_ID unset), so it is not one "
                f"of the job's ranks. HINT: {HINTS['slurm']}"
            )
        addr, port = _explicit_master(environ, "single")
        job_id = environ.get("SLURM_JOB_ID", "")
        return DistEnv(
            rank=0,
            local_rank=0,
            world_size=1,
            local_world_size=1,
            node_rank=0,
            num_nodes=1,
            master_addr=addr or "127.0.0.1",
            master_port=port or derive_port(job_id or "single"),
            launcher="single",
            job_id=job_id,
        )


# Detection order matters: torchrun can run inside a Slurm step (`srun torchrun ...`), and so
# can a local launcher (submitit's local executor in an `srun -n1` shell): the launcher that
# started this process comes first. Left-over local variables are removed before detection
# (`hpcddp.launch.leftovers`); the fallback comes last.
CONTEXTS = (TorchrunContext, LocalContext, SlurmStepContext, SingleContext)


def claimed_rank(environ: Mapping[str, str]) -> int | None:
    """The rank a launcher gave this process, read without checking anything else.

    For deciding who prints an error that every rank hits, even when resolving failed; None
    when no launcher numbered this process.
    """
    names = ["RANK"]
    if "SLURM_STEP_ID" in environ:
        names.append("SLURM_PROCID")
    names += [table["rank"] for table in LocalContext.TABLES]
    for name in names:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None
