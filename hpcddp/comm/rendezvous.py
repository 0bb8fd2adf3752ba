"""Meeting before the process group: one store, every rank's facts, one plan, refusals together.

Rank 0 serves a TCPStore on every interface (the agent does under torchrun), so a rank reaches
it whatever its node thinks the master's name means. Every rank posts a hello: its host, the
world it believes in, what ``MASTER_ADDR`` resolves to there, its interfaces and routes, and
its own refusal if it has one. Rank 0 reads them all and posts one plan: either every rank's
network interface, or the reasons the job cannot start, which every rank then raises at once
(no rank waits 300 s for a peer that already gave up).

The interface (`hpcddp.launch.netif`): the master's address is what the *other* nodes resolved
``MASTER_ADDR`` to (on its own node the name may mean 127.0.1.1); a rank on the master's node
takes the interface that carries that address, any other rank the one its kernel routes there
through. ``dist.socket_ifname`` overrides it, then ``GLOO_SOCKET_IFNAME`` set by the user.

The GPU (`hpcddp.launch.gpus`): every rank reports the UUIDs of the GPUs it sees; rank 0 gives
ranks of one host that see the same GPUs distinct ones in local-rank order, and refuses, naming
ranks, host and GPU, any GPU two NCCL ranks would share, before NCCL starts.
"""

import collections
import dataclasses
import datetime
import itertools
import json
import time
from collections.abc import Mapping

import torch.distributed as dist

from hpcddp import errors
from hpcddp.comm.quiet import c10d_noise_filtered
from hpcddp.errors import DistributedError, HpcddpError
from hpcddp.launch import netif
from hpcddp.launch.distenv import DistEnv
from hpcddp.launch.gpus import Gpu, View, assign, shared, sharing_message

_rounds = itertools.count()  # every rank makes the same sequence of process groups
POLL_S = 0.05


@dataclasses.dataclass(frozen=True)
class Network:
    """How one rank reaches the others: its interface, its address there, who chose it."""

    interface: str
    address: str
    chosen_by: str  # "route to the master", "dist.socket_ifname" or "GLOO_SOCKET_IFNAME"
    master_ip: str


@dataclasses.dataclass(frozen=True)
class Hello:
    """What one rank tells rank 0 before the process group exists."""

    rank: int
    host: str
    world_size: int
    resolved: list[str]  # MASTER_ADDR's IPv4 addresses as this rank's node resolves it
    routes: dict[str, list[str] | None]  # resolved address -> [interface, own address]
    interfaces: dict[str, list[str]]  # name -> IPv4 addresses
    user_ifname: str  # GLOO_SOCKET_IFNAME as the user set it ("" if not)
    refusal: list[str] | None = None  # [error class, message]
    local_rank: int = 0
    backend: str = "gloo"
    device: str = "cpu"  # the rank's own choice: "cpu" or "cuda:N"
    explicit: bool = False  # HPCDDP_DEVICE named the index: kept, only checked
    gpus: list[dict[str, object]] = dataclasses.field(default_factory=list)  # `gpus.Gpu`s

    def view(self) -> View:
        """This rank's GPUs and choice, as `hpcddp.launch.gpus` reads them."""
        index = int(self.device.partition(":")[2]) if self.device.startswith("cuda:") else None
        table = tuple(Gpu(**g) for g in self.gpus)  # type: ignore[arg-type]
        return View(self.rank, self.host, self.local_rank, table, index, self.explicit)


def hello_of(env: DistEnv, environ: Mapping[str, str], refusal: BaseException | None) -> Hello:
    """This rank's hello, from its own node's point of view."""
    table = netif.interfaces()
    resolved = netif.resolve(env.master_addr)
    routes: dict[str, list[str] | None] = {}
    for address in resolved:
        route = netif.route_to(address, table)
        routes[address] = None if route is None else [route.interface, route.address]
    told = None if refusal is None else [type(refusal).__name__, str(refusal)]
    return Hello(
        rank=env.rank,
        host=env.hostname,
        world_size=env.world_size,
        resolved=resolved,
        routes=routes,
        interfaces={name: [a for a, _ in addrs] for name, addrs in table.items()},
        user_ifname=environ.get("GLOO_SOCKET_IFNAME", ""),
        refusal=told,
        local_rank=env.local_rank,
        backend=env.backend,
        device=env.device,
        explicit=environ.get("HPCDDP_DEVICE", "").startswith("cuda:"),
        gpus=[dataclasses.asdict(g) for g in env.gpus],
    )


# -- the store ------------------------------------------------------------------------------


def connect_store(env: DistEnv, timeout_s: float, environ: Mapping[str, str]) -> dist.TCPStore:
    """Rank 0 serves on all interfaces (torchrun's agent serves when it says so); others connect."""
    agent = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    serve = env.rank == 0 and not agent
    try:
        with c10d_noise_filtered():
            return dist.TCPStore(
                env.master_addr,
                env.master_port,
                None,
                serve,
                timeout=datetime.timedelta(seconds=timeout_s),
                wait_for_workers=False,
                multi_tenant=True,
            )
    except Exception as err:  # torch raises several unrelated types here
        raise _store_error(env, err, timeout_s, serve) from err


def _store_error(env: DistEnv, err: Exception, timeout_s: float, serve: bool) -> HpcddpError:
    text = str(err)
    if serve and ("EADDRINUSE" in text or "address already in use" in text.lower()):
        return DistributedError(
            f"MASTER_PORT {env.master_port} on {env.hostname} is already in use by another "
            "process, so rank 0 cannot serve the rendezvous there. HINT: export "
            "MASTER_PORT=<a free port in 20000-32767> (`ss -ltn` lists the ports in use), or "
            "let hpcddp derive one by unsetting MASTER_PORT."
        )
    resolved = ", ".join(netif.resolve(env.master_addr)) or "nothing"
    return DistributedError(
        f"rank {env.rank} on {env.hostname} could not reach the rendezvous at "
        f"{env.master_addr}:{env.master_port} ({env.master_addr} resolves to {resolved} here) "
        f"within {timeout_s:.0f} s: {text.splitlines()[0] if text else type(err).__name__}. "
        "HINT: check that rank 0 runs (srun, not the batch shell), that MASTER_ADDR names its "
        "host, and that nothing blocks the port between nodes; `hpcddp check` shows each "
        "node's view."
    )


# -- the meeting ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Meeting:
    """The outcome for one rank: its own network and device; on rank 0 everyone's network."""

    network: Network
    everyone: dict[int, tuple[str, Network]]  # rank -> (host, network); rank 0 only
    device: str = "cpu"  # "cuda:N" as rank 0 assigned it (`plan_devices`)


def meet(
    store: dist.Store,
    env: DistEnv,
    mine: Hello,
    timeout_s: float,
    override: str = "",
    prefix: str = "",
) -> Meeting:
    """Post this rank's hello, let rank 0 decide, and return this rank's network (or raise).

    The keys live under ``prefix``: by default one per torchrun restart (read from the
    environment ``env`` was resolved from) and per process group this process made, which
    every rank counts alike.
    """
    restart = env.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = prefix or f"hpcddp/rdzv/{restart}/{next(_rounds)}"
    # Hellos are numbered in order of arrival, so rank 0 reads each once: O(world) requests.
    arrival = store.add(f"{prefix}/arrivals", 1)
    store.set(f"{prefix}/arrived/{arrival}", json.dumps(dataclasses.asdict(mine)))
    everyone = _decide(store, prefix, env, timeout_s, override) if env.rank == 0 else {}
    store.wait([f"{prefix}/plan"], datetime.timedelta(seconds=timeout_s + 60))
    plan = json.loads(store.get(f"{prefix}/plan"))
    if plan["refusal"] is not None:
        _linger_until_told(store, prefix, env)
        raise agreed_error(*plan["refusal"])
    network = Network(**json.loads(store.get(f"{prefix}/net/{env.rank}")))
    device = store.get(f"{prefix}/device/{env.rank}").decode()
    return Meeting(network, everyone, device)


def _linger_until_told(store: dist.Store, prefix: str, env: DistEnv, most_s: float = 5.0) -> None:
    """Rank 0 serves the store: it leaves only once every rank has read the refusal (or after
    ``most_s``), else a rank still reading it loses the store and prints a C++ trace instead."""
    told = store.add(f"{prefix}/told", 1)
    deadline = time.monotonic() + most_s
    while env.rank == 0 and told < env.world_size and time.monotonic() < deadline:
        time.sleep(POLL_S)
        told = store.add(f"{prefix}/told", 0)


def agreed_error(kind: str, message: str) -> HpcddpError:
    """The job's refusal, as the class rank 0 named, marked as printed once (by rank 0)."""
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, HpcddpError)):
        cls = DistributedError
    return errors.agreed(cls(message))


def _decide(
    store: dist.Store, prefix: str, env: DistEnv, timeout_s: float, override: str
) -> dict[int, tuple[str, Network]]:
    """Rank 0: gather the hellos, then post either every rank's network or the refusal."""
    hellos, refusal = _gather(store, prefix, env, timeout_s)
    networks: dict[int, Network] = {}
    devices: dict[int, str] = {}
    if refusal is None:
        networks, refusal = plan_networks(hellos, override)
    if refusal is None:
        devices, refusal = plan_devices(hellos)
    for rank, network in networks.items():
        store.set(f"{prefix}/net/{rank}", json.dumps(dataclasses.asdict(network)))
        store.set(f"{prefix}/device/{rank}", devices.get(rank, hellos[rank].device))
    store.set(f"{prefix}/plan", json.dumps({"refusal": refusal}))
    return {rank: (hellos[rank].host, network) for rank, network in networks.items()}


def _gather(
    store: dist.Store, prefix: str, env: DistEnv, timeout_s: float
) -> tuple[dict[int, Hello], list[str] | None]:
    """Every rank's hello, or a refusal as soon as one is certain (at the latest on timeout)."""
    hellos: dict[int, Hello] = {}
    read, deadline = 0, time.monotonic() + timeout_s
    while True:
        arrived = store.add(f"{prefix}/arrivals", 0)
        for number in range(read + 1, arrived + 1):  # set right after its number was taken
            hello = Hello(**json.loads(store.get(f"{prefix}/arrived/{number}")))
            if hello.rank in hellos:
                return hellos, _duplicate(hello, hellos[hello.rank])
            hellos[hello.rank] = hello
        read = arrived
        refusal = _early_refusal(env, hellos)
        if refusal is not None or len(hellos) == env.world_size:
            return hellos, refusal or _refusals(hellos)
        if time.monotonic() > deadline:
            return hellos, _missing(env, hellos, timeout_s)
        time.sleep(POLL_S)


def _duplicate(hello: Hello, first: Hello) -> list[str]:
    return [
        "LaunchError",
        f"rank {hello.rank} was claimed by two processes (on {first.host} and {hello.host}): "
        "two launchers numbered the same processes (submitit's local executor inside srun?). "
        "HINT: start each rank once: one task per rank with srun, or one local launcher "
        "outside srun.",
    ]


def _early_refusal(env: DistEnv, hellos: Mapping[int, Hello]) -> list[str] | None:
    """Refusals that need not wait for everyone: ranks that disagree on the world."""
    for hello in hellos.values():
        if hello.world_size != env.world_size or not 0 <= hello.rank < env.world_size:
            return [
                "LaunchError",
                f"rank {hello.rank} on {hello.host} believes the world has {hello.world_size} "
                f"ranks, rank 0 on {env.hostname} that it has {env.world_size}: the ranks were "
                "not started by one launcher (left-over RANK/WORLD_SIZE or HPCDDP_LOCAL_* "
                "variables?). HINT: `hpcddp env` on each rank shows what it read; unset the "
                "variables no launcher set.",
            ]
    return None


def _refusals(hellos: Mapping[int, Hello]) -> list[str] | None:
    """The ranks' own refusals, each distinct one once, naming the ranks unless all share it."""
    by_message: dict[tuple[str, str], list[Hello]] = collections.defaultdict(list)
    for hello in sorted(hellos.values(), key=lambda h: h.rank):
        if hello.refusal is not None:
            by_message[(hello.refusal[0], hello.refusal[1])].append(hello)
    if not by_message:
        return None
    lines = []
    for (_kind, message), who in by_message.items():
        everyone = len(by_message) == 1 and len(who) == len(hellos)
        lines.append(message if everyone else f"({describe_ranks(who)}) {message}")
    first_kind = next(iter(by_message))[0]
    return [first_kind, "\nhpcddp: error: ".join(lines)]


def describe_ranks(hellos: list[Hello]) -> str:
    """``rank 3 on n2`` or ``ranks 2, 3 on n2; rank 5 on n3``."""
    by_host: dict[str, list[int]] = collections.defaultdict(list)
    for hello in hellos:
        by_host[hello.host].append(hello.rank)
    parts = []
    for host, ranks in by_host.items():
        label = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{label} {', '.join(map(str, ranks))} on {host}")
    return "; ".join(parts)


def _missing(env: DistEnv, hellos: Mapping[int, Hello], timeout_s: float) -> list[str]:
    absent = [r for r in range(env.world_size) if r not in hellos]
    shown = ", ".join(map(str, absent[:16])) + (", ..." if len(absent) > 16 else "")
    seen = sorted({h.host for h in hellos.values()})
    return [
        "DistributedError",
        f"rank{'s' if len(absent) > 1 else ''} {shown} never reached the rendezvous at "
        f"{env.master_addr}:{env.master_port} within {timeout_s:.0f} s ({len(hellos)} of "
        f"{env.world_size} ranks did, from {', '.join(seen)}). HINT: those ranks did not start "
        "or cannot reach the master: look for their first error in the job's output, and run "
        "`hpcddp check` with the same resources.",
    ]


# -- the plan -------------------------------------------------------------------------------


def master_ip(hellos: Mapping[int, Hello]) -> str:
    """The master's address as the other nodes reach it (their most common answer).

    On the master's own node its name may resolve to 127.0.1.1; the other nodes' answer is the
    address the others connect to. A job on one node has no other answer: its own is right.
    """
    master_host = hellos[0].host
    remote = [h.resolved[0] for h in hellos.values() if h.host != master_host and h.resolved]
    remote = [a for a in remote if not netif.is_loopback(a)]
    if remote:
        return collections.Counter(remote).most_common(1)[0][0]
    return hellos[0].resolved[0] if hellos[0].resolved else "127.0.0.1"


def plan_networks(
    hellos: Mapping[int, Hello], override: str = ""
) -> tuple[dict[int, Network], list[str] | None]:
    """Every rank's interface, or the refusal naming each rank that has none."""
    ip = master_ip(hellos)
    networks: dict[int, Network] = {}
    problems: dict[str, list[Hello]] = collections.defaultdict(list)
    for rank, hello in sorted(hellos.items()):
        network, problem = _network_of(hello, ip, override)
        if problem:
            problems[problem].append(hello)
        elif network is not None:
            networks[rank] = network
    if not problems:
        return networks, None
    lines = [f"({describe_ranks(who)}) {problem}" for problem, who in problems.items()]
    return {}, ["LaunchError", "\nhpcddp: error: ".join(lines)]


def plan_devices(hellos: Mapping[int, Hello]) -> tuple[dict[int, str], list[str] | None]:
    """Every rank's device (`hpcddp.launch.gpus.assign`), or the refusal naming each GPU
    that NCCL ranks would share.

    Only NCCL refuses two ranks on one GPU (by host and PCI bus id: MIG instances of one GPU
    count as one); gloo ranks may share one (slowly).
    """
    views = [h.view() for h in hellos.values()]
    chosen = assign(views)
    nccl = {rank for rank, hello in hellos.items() if hello.backend == "nccl"}
    pairs = shared(views, chosen, physical=True)
    clashes = [(gpu, who) for gpu, who in pairs if {v.rank for v in who} & nccl]
    if clashes:
        lines = [sharing_message(gpu, who) for gpu, who in clashes]
        return {}, ["LaunchError", "\nhpcddp: error: ".join(lines)]
    devices = {rank: hello.device for rank, hello in hellos.items()}
    devices.update({rank: f"cuda:{index}" for rank, index in chosen.items()})
    return devices, None


def _network_of(hello: Hello, ip: str, override: str) -> tuple[Network | None, str]:
    """One rank's interface: the config's, then the user's GLOO_SOCKET_IFNAME, else the route."""
    have = ", ".join(sorted(hello.interfaces)) or "none"
    if override:
        name = netif.pick_named(override, hello.interfaces)
        if name is None:
            return None, (
                f"dist.socket_ifname={override} names no interface of this node (it has {have})."
                " HINT: list each node kind's name, comma-separated (eth0,ens4), or leave it "
                "empty to use the interface that routes to the master."
            )
        return Network(name, _first(hello.interfaces[name]), "dist.socket_ifname", ip), ""
    if hello.user_ifname:
        names = [n.strip() for n in hello.user_ifname.split(",")]
        missing = [n for n in names if n not in hello.interfaces]
        if missing:
            return None, (
                f"GLOO_SOCKET_IFNAME={hello.user_ifname} names no interface of this node "
                f"({missing[0]} is missing; it has {have}). HINT: unset GLOO_SOCKET_IFNAME and "
                "hpcddp picks the interface that routes to the master, or set dist.socket_ifname."
            )
        first = names[0]
        return Network(first, _first(hello.interfaces[first]), "GLOO_SOCKET_IFNAME", ip), ""
    return _routed(hello, ip)


def _routed(hello: Hello, ip: str) -> tuple[Network | None, str]:
    carrier = next((n for n, addrs in hello.interfaces.items() if ip in addrs), None)
    if carrier is not None:
        return Network(carrier, ip, "route to the master", ip), ""
    route = hello.routes.get(ip)
    if route is not None:
        return Network(route[0], route[1], "route to the master", ip), ""
    if netif.is_loopback(ip):
        loop = next((n for n, a in hello.interfaces.items() if any(map(netif.is_loopback, a))), "")
        return Network(loop or "lo", ip, "route to the master", ip), ""
    seen = ", ".join(hello.resolved) or "nothing"
    return None, (
        f"the master is reached at {ip} by the other nodes, but here its name resolves to "
        f"{seen} and no interface routes to {ip}. HINT: fix this node's /etc/hosts or DNS for "
        "the master's name, or export MASTER_ADDR=<the master's cluster address>."
    )


def _first(addresses: list[str]) -> str:
    return addresses[0] if addresses else ""


def as_text(everyone: Mapping[int, tuple[str, Network]]) -> str:
    """One line for the log: ``n1: eth0 10.0.0.1 (ranks 0-1); n2: ens4 10.0.0.2 (ranks 2-3)``."""
    by_host: dict[tuple[str, str, str], list[int]] = collections.defaultdict(list)
    for rank, (host, network) in sorted(everyone.items()):
        by_host[(host, network.interface, network.address)].append(rank)
    return "; ".join(
        f"{host}: {name} {address} ({_span(ranks)})"
        for (host, name, address), ranks in by_host.items()
    )


def _span(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return f"ranks {', '.join(map(str, ranks))}"
