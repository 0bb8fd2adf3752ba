"""The process group's whole life in one place: meet, export, bind, init with a timeout, destroy.

``os.environ`` is written here and nowhere else, so what torch reads is exactly what
`resolve_env` and the rendezvous (`hpcddp.comm.rendezvous`) decided. The group is always
destroyed, so a finished or failed run never leaves a rank blocked on a peer that already left.
"""

import contextlib
import dataclasses
import datetime
import enum
import logging
import os
import pathlib
import time
from collections.abc import Iterator, Mapping

import torch
import torch.distributed as dist

from hpcddp.comm import join_errors, rendezvous
from hpcddp.comm.flight_recorder import flight_recorder_env
from hpcddp.comm.rendezvous import Meeting, Network
from hpcddp.errors import DistributedError, HpcddpError
from hpcddp.launch import cpus
from hpcddp.launch.distenv import DistEnv
from hpcddp.launch.netif import IFNAME_VARS
from hpcddp.launch.resolve import cpus_for_this_rank

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0  # five minutes, not gloo's thirty: a hang should end soon


@dataclasses.dataclass(frozen=True)
class Joined:
    """What joining gave this rank: its device, how it reaches the others, its CPUs."""

    device: torch.device
    meeting: Meeting | None  # None in a world of one
    pinning: cpus.Pinning | None = None  # None: a CPU rank, or pinning turned off


def network_env(network: Network, environ: Mapping[str, str]) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME for the chosen interface.

    A variable the user set is left alone, unless the config (``dist.socket_ifname``) chose;
    NCCL reads its value as a prefix, so ``=`` asks it for exactly this name.
    """
    wanted = {
        "GLOO_SOCKET_IFNAME": network.interface,
        "NCCL_SOCKET_IFNAME": f"={network.interface}",
    }
    forced = network.chosen_by == "dist.socket_ifname"
    return {name: value for name, value in wanted.items() if forced or not environ.get(name)}


def export_env(
    env: DistEnv, network: Network | None = None, log_dir: pathlib.Path | None = None
) -> dict[str, str | None]:
    """Write the ``env://`` variables (and the interface) for torch and libraries that read them,
    and NCCL's flight recorder settings for a run that logs to ``log_dir``.

    Returns what they were before, so the process can be put back as it was.
    """
    exported = env.torch_env()
    if network is not None:
        exported.update(network_env(network, os.environ))
    exported.update(flight_recorder_env(env.backend, log_dir, os.environ))
    previous = {name: os.environ.get(name) for name in [*exported, *IFNAME_VARS]}
    os.environ.update(exported)
    return previous


def restore_env(previous: dict[str, str | None]) -> None:
    """Undo `export_env`: a second run in this process must not mistake itself for torchrun."""
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def cpu_threads(env: DistEnv, environ: Mapping[str, str] = os.environ) -> int:
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


def pin_near_gpu(env: DistEnv, on: bool, sysfs: pathlib.Path = cpus.SYSFS) -> cpus.Pinning | None:
    """Pin a GPU rank to the cores of its GPU's NUMA node (``dist.pin_cpus``), before any loader
    worker starts (they inherit it); its intra-op threads then fit those cores."""
    gpu = env.gpu
    if not on or gpu is None:
        return None
    pinning = cpus.near_gpu(gpu, cpus.allowed_cpus(), sysfs)
    cpus.pin(pinning)
    if pinning.numa_node is not None:
        torch.set_num_threads(min(torch.get_num_threads(), len(pinning.cpus)))
    log.debug("CPUs %s: %s", cpus.format_cpulist(pinning.cpus), pinning.reason)
    return pinning


def init_group(env: DistEnv, timeout: datetime.timedelta, store: dist.Store | None) -> None:
    """init_process_group on the rendezvous store (an in-memory one in a world of one)."""
    device_id = torch.device(env.device) if env.backend == "nccl" else None
    dist.init_process_group(
        env.backend,
        store=store if store is not None else dist.HashStore(),
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
        device_id=device_id,
    )


def meet(
    env: DistEnv,
    timeout_s: float,
    socket_ifname: str = "",
    refusal: HpcddpError | None = None,
) -> tuple[dist.Store, Meeting]:
    """Connect to the job's store and agree on every rank's network (or refuse, all at once)."""
    store = rendezvous.connect_store(env, timeout_s, os.environ)
    mine = rendezvous.hello_of(env, os.environ, refusal)
    return store, rendezvous.meet(store, env, mine, timeout_s, socket_ifname)


@contextlib.contextmanager
def joined(
    env: DistEnv,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    socket_ifname: str = "",
    refusal: HpcddpError | None = None,
    pin_cpus: bool = True,
    log_dir: pathlib.Path | None = None,
) -> Iterator[Joined]:
    """Meet, export, bind, join; yield the device and network; always leave, cleanly if possible.

    ``refusal`` is this rank's own reason not to run (found before joining): it is told to
    every rank at the rendezvous, so all of them stop at once with the same error. With
    ``pin_cpus`` a GPU rank runs on the cores nearest its GPU (`pin_near_gpu`). NCCL's flight
    recorder dumps go to ``log_dir`` (`hpcddp.comm.flight_recorder`).
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    meeting = None
    if env.world_size > 1:
        store, meeting = meet(env, timeout_s, socket_ifname, refusal)
        env = dataclasses.replace(env, device=meeting.device)  # rank 0 spread the GPUs
    elif refusal is not None:
        raise refusal
    previous = export_env(env, meeting.network if meeting else None, log_dir)
    allowed = cpus.allowed_cpus()
    try:
        torch.set_num_threads(cpu_threads(env))
        pinning = pin_near_gpu(env, pin_cpus)
        device = bind_device(env)
        try:
            init_group(env, timeout, store if meeting else None)
        except Exception as err:  # gloo and NCCL raise several unrelated types here
            raise _join_error(env, meeting, err, timeout_s) from err
        how = Leaving.ALONE
        try:
            yield Joined(device, meeting, pinning)
            how = Leaving.FINISHED
        except KeyboardInterrupt:
            how = Leaving.INTERRUPTED
            raise
        finally:
            leave_together(how)
    finally:
        restore_env(previous)
        cpus.pin(cpus.Pinning(frozenset(allowed), None, "as before"), force=True)


def _join_error(
    env: DistEnv, meeting: Meeting | None, err: Exception, timeout_s: float
) -> DistributedError:
    """The ranks met, but their backend could not connect: say over what, the backend's own
    reason (NCCL's ``Last error:`` lines), and what to check for that cause
    (`hpcddp.comm.join_errors`)."""
    text = str(err)
    over = f" over {meeting.network.interface} ({meeting.network.address})" if meeting else ""
    return DistributedError(
        f"rank {env.rank} on {env.hostname} met the others but {env.backend} could not connect "
        f"them{over} within {timeout_s:.0f} s: {join_errors.reason(text) or type(err).__name__}. "
        f"HINT: {join_errors.hint(env.backend, text)}."
    )


@contextlib.contextmanager
def process_group(env: DistEnv, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[torch.device]:
    """Meet, export, bind, join; yield the device; always leave the group, cleanly if possible."""
    with joined(env, timeout_s) as done:
        yield done.device


class Leaving(enum.Enum):
    """How a rank leaves the group, which decides whether it waits for the others."""

    FINISHED = "finished"  # every rank got here: meet at a barrier, rank 0 leaves last
    INTERRUPTED = "interrupted"  # Ctrl-C reached every rank: no barrier, rank 0 leaves last
    ALONE = "alone"  # a failure: peers may be dead or hung; wait for nobody


_LAST_LEFT: list[object] = []  # the groups this process left last: see `_outlive_them`


def _outlive_them() -> None:
    """Keep the groups about to be destroyed referenced until the next leaving (or the end of
    the process), so that neither destroying them nor dropping the DDP model that holds one
    runs a group's destructor now. A gloo group's destructor joins its worker threads while
    holding the GIL, and a worker still dropping the last collective's work needs the GIL to
    release the Python state that work captured: a deadlock that left a rank hung for good
    after a finished run (pytorch#75097, #56297; here within 50 two-rank DDP runs in a row,
    `tests/local/test_leaving_groups.py`). By the next leaving, or the interpreter's end,
    every worker is idle and joins at once."""
    world = getattr(dist.distributed_c10d, "_world", None)
    _LAST_LEFT[:] = list(getattr(world, "pg_map", None) or ())


def abandon() -> None:
    """Leave after a failure: abort every group rather than destroy it. Destroying an NCCL
    group waits for its collectives, and one stuck on a dead or hung peer would hold this rank
    until NCCL's watchdog kills it (SIGABRT), before its error was ever printed."""
    _outlive_them()
    try:
        dist.distributed_c10d._abort_process_group()
    except (RuntimeError, ValueError):  # a backend that cannot abort: destroy, as before
        if dist.is_initialized():
            dist.destroy_process_group()


INTERRUPTED_WAIT_S = 10.0  # rank 0, after a Ctrl-C: at most this for the others to leave


def leave_together(how: Leaving, timeout_s: float = 60.0) -> None:
    """Leave the group; unless alone, rank 0, which serves the store, leaves last.

    If rank 0 exits while a peer is still inside destroy_process_group, that peer loses the
    store under its feet and can abort ("terminate called without an active exception"), so
    a finished job, or one stopped by a second Ctrl-C, would end with a rank killed by SIGABRT.
    A Ctrl-C reaches every rank, but at its own moment: no barrier then (a rank may already be
    in the next collective), rank 0 only waits a short while for the others to have left.
    """
    if not dist.is_initialized():
        return
    if how is Leaving.ALONE:
        abandon()
        return
    _outlive_them()
    if dist.get_world_size() == 1:
        dist.destroy_process_group()
        return
    if how is Leaving.FINISHED:
        dist.barrier()
    else:
        timeout_s = min(timeout_s, INTERRUPTED_WAIT_S)
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()  # keeps rank 0's server alive below
    dist.destroy_process_group()
    if rank != 0:
        with contextlib.suppress(RuntimeError):  # rank 0 gave up waiting: nobody to tell
            store.add("hpcddp/left", 1)
        return
    deadline = time.monotonic() + timeout_s
    while store.add("hpcddp/left", 0) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
