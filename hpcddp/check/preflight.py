"""`hpcddp check` on the rank side: join exactly as training would, gather facts, measure, judge.

Every rank resolves its place and meets the others through the same rendezvous as
`hpcddp.Trainer` (so a refusal or a wrong interface shows up here first), then reports its
host, CPUs, GPUs, interface, versions, free memory and disk, and what the master's and its own
name resolve to. Rank 0 then times an all-reduce, a transfer in each direction between every
pair of nodes (one pair at a time), and the same computation on every rank, and judges the
lot (`hpcddp.check.checkup`).
"""

import contextlib
import dataclasses
import importlib.metadata
import pathlib
import platform
import secrets
import shutil
import socket
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psutil
import torch
import torch.distributed as dist

from hpcddp import exit_codes
from hpcddp.check import checkup, cpu_quota
from hpcddp.comm import collectives
from hpcddp.comm.group import Joined, joined
from hpcddp.config import Config
from hpcddp.errors import HpcddpError
from hpcddp.launch import cpus, error_reports, gpus, netif
from hpcddp.launch.distenv import DistEnv
from hpcddp.launch.resolve import place

SMALL_BYTES = 8  # the latency probe
PAIR_BYTES = 4 << 20
COMPUTE = (384, 2)  # on CPU: an N x N matmul, this many times per batch
GPU_COMPUTE = (4096, 8)  # big enough that a GPU computes rather than waits for launches
# Three CFS quota periods (100 ms each) and more: a throttled node cannot hide in one burst.
PROBE_WINDOW_S = 0.3
PROBE_WINDOWS = 4
MIN_BATCHES = 3


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the check found; the report and problems on rank 0 only (None elsewhere)."""

    report: dict[str, Any] | None
    problems: list[checkup.Problem]
    errors: int  # the same on every rank


def _versions() -> dict[str, str]:
    nccl = ""
    if torch.cuda.is_available():
        with contextlib.suppress(Exception):
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
    try:
        ours = importlib.metadata.version("hpcddp")
    except importlib.metadata.PackageNotFoundError:
        ours = ""
    return {
        "torch": torch.__version__,
        "hpcddp": ours,
        "python": platform.python_version(),
        "cuda": torch.version.cuda or "",
        "nccl": nccl,
    }


def _existing(path: pathlib.Path) -> pathlib.Path:
    """The path itself or its nearest existing parent (for free disk before the run exists)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _gpu_facts(env: DistEnv, device: torch.device, environ: Mapping[str, str]) -> dict[str, Any]:
    """The GPUs this rank sees (their UUIDs tell per-task GPUs apart: each rank's only GPU is
    its number 0) and the one the rendezvous gave it, by the rule training uses."""
    used = next((g for g in env.gpus if device.type == "cuda" and g.index == device.index), None)
    ids = environ.get("CUDA_VISIBLE_DEVICES") or ",".join(str(g.index) for g in env.gpus)
    return {
        "gpus_visible": len(env.gpus),
        "gpu_ids": ids if env.gpus else "",
        "gpu_uuids": [g.uuid for g in env.gpus],
        "gpu_bus_ids": [g.bus_id for g in env.gpus],
        "gpu_index": used.index if used else None,
        "gpu": gpus.describe(used),
    }


def _cpu_facts(
    env: DistEnv, done: Joined, config: Config, environ: Mapping[str, str]
) -> dict[str, Any]:
    """The CPUs this rank runs on (after pinning near its GPU) and the loader workers they allow."""
    allowed = cpus.allowed_cpus()
    pinning = done.pinning
    workers = config.data.num_workers
    return {
        "cpus": len(allowed),
        "cpu_list": cpus.format_cpulist(allowed),
        "numa_node": pinning.numa_node if pinning else None,
        "workers": workers if workers >= 0 else cpus.default_workers(env, environ, allowed),
    }


def probe_size(device: torch.device) -> tuple[int, int]:
    """(N, matmuls per batch) for the compute probe on this kind of device."""
    return GPU_COMPUTE if device.type == "cuda" else COMPUTE


def _batch(a: torch.Tensor, repeats: int) -> torch.Tensor:
    for _ in range(repeats):
        a = torch.tanh(a @ a)  # tanh keeps the values finite, so every pass costs the same
    return a


def _compute_ms(device: torch.device, window_s: float = PROBE_WINDOW_S) -> float:
    """Milliseconds per batch of the same computation, sustained: the best of a few windows.

    A throttled node is only slow on average: a CFS quota (15 ms of every 100 ms, say) lets a
    short burst run at full speed, so the fastest of a few short probes hides it. Each window
    times batches back to back over several quota periods, the speed a training step gets;
    the best window counts, as a busy moment only slows a window down while a throttled or
    clocked-down core slows every one. On CPU one thread computes (a core's speed, not how
    threads fare on shared cores); on a GPU the batches are timed with CUDA events, on a size
    that keeps the GPU computing.
    """
    size, repeats = probe_size(device)
    a = torch.randn(size, size, device=device)
    _sync(device, _batch(a, 1))  # warm-up: kernels chosen, pages touched
    if device.type == "cuda":
        return min(_cuda_ms(device, a, repeats, window_s) for _ in range(PROBE_WINDOWS))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return min(_cpu_ms(a, repeats, window_s) for _ in range(PROBE_WINDOWS))
    finally:
        torch.set_num_threads(threads)


def _compute_facts(device: torch.device) -> dict[str, float]:
    """The probe's time per batch, the share of it a CPU quota held this rank back, and the
    quota itself in CPUs (0: none)."""
    dirs = cpu_quota.own_dirs()
    throttled, start = cpu_quota.throttled_s(dirs), time.perf_counter()
    ms = _compute_ms(device)
    held = (cpu_quota.throttled_s(dirs) - throttled) / (time.perf_counter() - start)
    held = min(held, 1.0)  # the kernel adds up every CPU's throttled time: 2 CPUs, up to 2x
    quota = cpu_quota.limit_cpus(dirs)
    return {"compute_ms": ms, "compute_throttled": round(held, 3), "cpu_quota": quota}


def _cpu_ms(a: torch.Tensor, repeats: int, window_s: float) -> float:
    batches, start = 0, time.perf_counter()
    while batches < MIN_BATCHES or time.perf_counter() - start < window_s:
        _batch(a, repeats)
        batches += 1
    return (time.perf_counter() - start) * 1000 / batches


def _cuda_ms(device: torch.device, a: torch.Tensor, repeats: int, window_s: float) -> float:
    """The GPU's own time for batches run back to back (events), as long as ``window_s``."""
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    batches, start = 0, time.perf_counter()
    first.record()
    while batches < MIN_BATCHES or time.perf_counter() - start < window_s:
        a = _batch(a, repeats)
        batches += 1
        torch.cuda.synchronize(device)  # the wall clock follows the GPU's pace
    last.record()
    last.synchronize()
    return float(first.elapsed_time(last)) / batches


def _sync(device: torch.device, a: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    else:
        a.sum().item()


def _model_room(env: DistEnv, device: torch.device) -> dict[str, Any]:
    """The memory this rank has for the model: its GPU's free memory, or else its node's
    available RAM shared by the node's ranks."""
    if device.type == "cuda":
        return {"model_room_bytes": torch.cuda.mem_get_info(device)[0], "model_room_kind": "GPU"}
    share = psutil.virtual_memory().available // max(env.local_world_size, 1)
    return {"model_room_bytes": share, "model_room_kind": "RAM"}


def _model_facts(config: Config, measure: Callable[[], dict[str, Any]] | None) -> dict[str, Any]:
    """The configured model's size (rank 0, once), or why it is not known."""
    if measure is None or not config.model.factory:
        return {"model": None, "model_unknown": "no model.factory configured"}
    try:
        return {"model": measure(), "model_unknown": ""}
    except Exception as err:  # a factory that cannot build on the meta device, say
        why = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        return {"model": None, "model_unknown": f"the factory failed on the meta device: {why}"}


def rank_facts(
    env: DistEnv, done: Joined, config: Config, environ: Mapping[str, str]
) -> dict[str, Any]:
    """This rank's row of the table, and what the rules need besides."""
    network = done.meeting.network if done.meeting else None
    run_dir = pathlib.Path(config.run.dir)
    slurm_cpus = environ.get("SLURM_CPUS_PER_TASK", "")
    return {
        "rank": env.rank,
        "local_rank": env.local_rank,
        "local_world_size": env.local_world_size,
        "host": env.hostname,
        "launcher": env.launcher,
        "master_addr": env.master_addr,
        **_cpu_facts(env, done, config, environ),
        "slurm_cpus_per_task": int(slurm_cpus) if slurm_cpus.isdigit() else 0,
        "srun_cpus_per_task": environ.get("SRUN_CPUS_PER_TASK", ""),
        **_gpu_facts(env, done.device, environ),
        "interface": network.interface if network else "",
        "address": network.address if network else "",
        "link_mbps": netif.link_speed_mbps(network.interface) if network else 0,
        "interfaces": {n: [a for a, _ in addrs] for n, addrs in netif.interfaces().items()},
        "master_resolves": netif.resolve(env.master_addr),
        "own_name": netif.resolve(socket.gethostname()),
        "versions": _versions(),
        "mem_free_gb": psutil.virtual_memory().available / 2**30,
        "disk_free_gb": shutil.disk_usage(_existing(run_dir)).free / 2**30,
        "run_dir": str(run_dir),
        **_compute_facts(done.device),
        **_model_room(env, done.device),
    }


@contextlib.contextmanager
def _token_in(run_dir: pathlib.Path, rank: int) -> Iterator[str]:
    """Rank 0 leaves a token in the run directory: who else sees it shares the directory."""
    token = ""
    made = not run_dir.exists()
    if rank == 0:
        token = secrets.token_hex(8)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / f".hpcddp-check-{token}").write_text(token)
    token = collectives.broadcast_object(token)
    try:
        yield token
    finally:
        collectives.all_gather_object(None)  # everyone looked before it goes
        if rank == 0:
            (run_dir / f".hpcddp-check-{token}").unlink(missing_ok=True)
            if made:
                with contextlib.suppress(OSError):
                    run_dir.rmdir()


def _allreduce(env: DistEnv, device: torch.device, nbytes: int, repeats: int) -> float:
    """Median milliseconds of one all-reduce of ``nbytes`` over every rank.

    A slow network gets fewer repeats (about two seconds' worth after the warm-up), so a check
    on a crawling link still ends in seconds.
    """
    tensor = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=device)
    start = time.perf_counter()
    dist.all_reduce(tensor)  # warm-up: connections and buffers
    took = collectives.broadcast_object(time.perf_counter() - start)  # every rank the same
    repeats = max(1, min(repeats, int(2.0 / max(took, 1e-6))))
    timings = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timings.append((time.perf_counter() - start) * 1000)
    return statistics.median(timings)


def measure_allreduce(env: DistEnv, device: torch.device, size_mb: float) -> dict[str, Any]:
    """Latency (8 bytes) and bus bandwidth (``size_mb``), NCCL's busbw convention."""
    nbytes = int(size_mb * (1 << 20)) // 4 * 4
    small_ms = _allreduce(env, device, SMALL_BYTES, 10)
    ms = _allreduce(env, device, nbytes, 5)
    n = env.world_size
    bus = nbytes * 8 * 2 * (n - 1) / n / (ms / 1000) / 1e9 if n > 1 else 0.0
    timings = {"small_bytes": SMALL_BYTES, "small_ms": small_ms, "bytes": nbytes, "ms": ms}
    return {**timings, "bus_gbps": bus}


def _transfer_s(env: DistEnv, tensor: torch.Tensor, src: int, dst: int) -> float:
    """Seconds for ``src`` to send ``tensor`` to ``dst``, as ``dst`` saw it (0 elsewhere)."""
    dist.barrier()
    start = time.perf_counter()
    if env.rank == src:
        dist.send(tensor, dst)
    elif env.rank == dst:
        dist.recv(tensor, src)
        if tensor.device.type == "cuda":
            torch.cuda.synchronize(tensor.device)
    return time.perf_counter() - start if env.rank == dst else 0.0


def measure_pairs(
    env: DistEnv, device: torch.device, leaders: Mapping[str, int], nbytes: int, repeats: int = 3
) -> list[dict[str, Any]]:
    """Each ordered pair of nodes in turn, the others idle: the first rank of one node sends to
    the first of the other. The best of ``repeats`` counts: a busy moment only slows a transfer,
    while a slow link slows all of them."""
    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    results = []
    for src_host, src in leaders.items():
        for dst_host, dst in leaders.items():
            if src == dst:
                continue
            _transfer_s(env, tensor[:1024], src, dst)  # warm-up: buffers, the first packets
            best = min(_transfer_s(env, tensor, src, dst) for _ in range(repeats))
            measured = collectives.broadcast_object(best if env.rank == dst else None, src=dst)
            gbps = nbytes * 8 / measured / 1e9 if measured else 0.0
            results.append({"src": src_host, "dst": dst_host, "gbps": gbps})
    return results


def _leaders(ranks: list[dict[str, Any]]) -> dict[str, int]:
    return {host: facts[0]["rank"] for host, facts in checkup.by_host(ranks).items()}


def _report(
    env: DistEnv,
    done: Joined,
    config: Config,
    size_mb: float,
    measure: Callable[[], dict[str, Any]] | None,
) -> dict[str, Any] | None:
    """Gather everyone's facts and measure, inside the group; the report on rank 0."""
    with _token_in(pathlib.Path(config.run.dir), env.rank) as token:
        mine = rank_facts(env, done, config, env.environ)
        mine["sees_run_dir"] = (pathlib.Path(config.run.dir) / f".hpcddp-check-{token}").exists()
    ranks = collectives.all_gather_object(mine)
    allreduce = measure_allreduce(env, done.device, size_mb)
    links = [f["link_mbps"] for f in ranks if f["link_mbps"]]
    allreduce["link_gbps"] = min(links) / 1000 if links and len(_leaders(ranks)) > 1 else 0.0
    pairs = measure_pairs(env, done.device, _leaders(ranks), PAIR_BYTES)
    if not env.is_main:
        return None
    network = done.meeting.network if done.meeting else None
    return {
        "ranks": ranks,
        "job_id": env.job_id,
        "backend": env.backend,
        "master_addr": env.master_addr,
        "master_port": env.master_port,
        "master_ip": network.master_ip if network else "",
        # a local launcher's port was free a moment ago; a Slurm job's was chosen by hand
        "port_explicit": env.launcher == "slurm" and bool(env.environ.get("MASTER_PORT")),
        "gpus_asked": config.slurm.gpus_per_node if env.launcher == "slurm" else 0,
        "allreduce": allreduce,
        "pairs": pairs,
        "pair_bytes": PAIR_BYTES,
        "compute_what": _compute_what(done.device),
        "strategy": config.dist.strategy,
        "precision": config.train.precision,
        **_model_facts(config, measure),
    }


def _compute_what(device: torch.device) -> str:
    size, repeats = probe_size(device)
    return f"{size}x{size} matmul x{repeats}, best {PROBE_WINDOW_S:g} s of {PROBE_WINDOWS}"


def check(
    config: Config,
    size_mb: float = 16.0,
    env: DistEnv | None = None,
    measure_model: Callable[[], dict[str, Any]] | None = None,
) -> Outcome:
    """Run the pre-flight on this rank; every rank returns the same number of errors.

    ``measure_model`` gives the configured model's size (`hpcddp.train.model_size.measure`,
    handed in from above: check and train are sibling layers); rank 0 calls it once."""
    refusal: HpcddpError | None = None
    if env is None:
        env, refusal = place()
    if config.dist.backend:
        env = dataclasses.replace(env, backend=config.dist.backend)
    # the check's own collectives wait at most this long for a node that cannot keep up
    timeout_s = min(config.dist.timeout_s, 120.0)
    with joined(
        env,
        timeout_s,
        socket_ifname=config.dist.socket_ifname,
        refusal=refusal,
        pin_cpus=config.dist.pin_cpus,
    ) as done:
        torch.manual_seed(env.rank)
        report = _report(env, done, config, size_mb, measure_model)
        found = checkup.problems(report) if report is not None else []
        errors = collectives.broadcast_object(sum(p.severity == "error" for p in found))
        if errors and not env.is_main:
            # rank 0 may print and exit (status 1) while this rank still leaves the group
            error_reports.leave_with_status_if_ended(exit_codes.FAILED)
    return Outcome(report, found, errors)
