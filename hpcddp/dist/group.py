"""The process group's whole life in one place: export, bind, init with a timeout, destroy.

``os.environ`` is written here and nowhere else, so what torch reads is exactly what
`resolve_env` decided. The group is always destroyed, so a finished or failed run never leaves
a rank blocked on a peer that already left.
"""

import contextlib
import datetime
import logging
import os
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from hpcddp.launch.distenv import DistEnv
from hpcddp.launch.resolve import cpus_for_this_rank
from hpcddp.errors import DistributedError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0  # five minutes, not gloo's thirty: a hang should end soon


def export_env(env: DistEnv) -> dict[str, str | None]:
    """Write the ``env://`` variables for torch and for libraries that read them.

    Returns what they were before, so the process can be put back as it was.
    """
    exported = env.torch_env()
    previous = {name: os.environ.get(name) for name in exported}
    os.environ.update(exported)
    return previous


def restore_env(previous: dict[str, str | None]) -> None:
    """Undo `export_env`: a second run in this process must not mistake itself for torchrun."""
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def cpu_threads(env: DistEnv, environ=os.environ) -> int:
    """Intra-op threads per rank: OMP_NUM_THREADS, else this rank's share of its Slurm task's
    CPUs (`cpus_for_this_rank`), else of this node's cores.

    torch defaults to every core in every process; K ranks on one node then fight over the
    cores and a 2-process run can be 10x slower than one process.
    """
    if environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(int(environ["OMP_NUM_THREADS"]), 1)
    cpus = cpus_for_this_rank(env, environ)
    if cpus is not None:
        return cpus
    return max((os.cpu_count() or 1) // max(env.local_world_size, 1), 1)


def bind_device(env: DistEnv) -> torch.device:
    """Make this rank's GPU the current one before any CUDA work or NCCL init."""
    device = torch.device(env.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def init_process_group(env: DistEnv, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join the job's process group; a world of one needs no port and uses an in-memory store."""
    timeout = datetime.timedelta(seconds=timeout_s)
    device_id = torch.device(env.device) if env.backend == "nccl" else None
    if env.world_size == 1:
        dist.init_process_group(env.backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout, device_id=device_id)
        return
    log.info("joining process group: rank %d/%d via %s:%d (%s)", env.rank, env.world_size,
             env.master_addr, env.master_port, env.backend)
    try:
        dist.init_process_group(env.backend, init_method="env://", rank=env.rank,
                                world_size=env.world_size, timeout=timeout, device_id=device_id)
    except Exception as err:  # torch raises several unrelated types here
        if "EADDRINUSE" in str(err) or "address already in use" in str(err).lower():
            raise DistributedError(
                f"MASTER_PORT {env.master_port} on {env.hostname} is already in use by another "
                "process, so rank 0 cannot serve the rendezvous there. HINT: export "
                "MASTER_PORT=<a free port in 20000-32767> (`ss -ltn` lists the ports in use), or "
                "let hpcddp derive one by unsetting MASTER_PORT.") from err
        raise DistributedError(
            f"rank {env.rank} on {env.hostname} could not join the process group at "
            f"{env.master_addr}:{env.master_port} within {timeout_s:.0f} s: {err}. HINT: check "
            "that every rank runs (srun, not the batch shell), that the master host is reachable, "
            "and that MASTER_PORT is free (set MASTER_PORT to choose another)."
        ) from err


@contextlib.contextmanager
def process_group(env: DistEnv, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[torch.device]:
    """Export, bind, join; yield the device; always leave the group, cleanly when possible."""
    previous = export_env(env)
    try:
        torch.set_num_threads(cpu_threads(env))
        device = bind_device(env)
        init_process_group(env, timeout_s)
        finished = False
        try:
            yield device
            finished = True
        finally:
            leave_together(finished)
    finally:
        restore_env(previous)


def leave_together(finished: bool, timeout_s: float = 60.0) -> None:
    """Leave together after success; rank 0, which serves the store, leaves last.

    If rank 0 exits while a peer is still inside destroy_process_group, that peer loses the
    store under its feet and can abort ("terminate called without an active exception"), so
    a finished job would end with a failed rank.
    """
    if not dist.is_initialized():
        return
    if not finished or dist.get_world_size() == 1:
        dist.destroy_process_group()
        return
    dist.barrier()
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()  # keeps rank 0's server alive below
    dist.destroy_process_group()
    if rank != 0:
        store.add("hpcddp/left", 1)
        return
    deadline = time.monotonic() + timeout_s
    while store.add("hpcddp/left", 0) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
