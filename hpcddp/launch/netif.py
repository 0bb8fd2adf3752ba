"""Which network interface reaches the master: the one fact gloo and NCCL cannot find alone.

gloo binds to whatever the node's own hostname resolves to. On Debian that is ``127.0.1.1``
(the installer's ``127.0.1.1 <hostname>`` line), so rank 0 advertises loopback and every other
node fails with "connectFullMesh failed ... remote=[127.0.1.1]" (pytorch#8672). NCCL picks by
name prefix (``ib*`` first) and can choose an interface that leads nowhere. What works on every
node is the interface that routes to the master's address; on the master's own node, the one
that carries that address (the kernel routes a host's own address through ``lo``).

Torch-free: the kernel answers the route question for a UDP ``connect()`` (no packet is sent),
psutil lists the interfaces of this process's network namespace.
"""

import dataclasses
import ipaddress
import socket
from collections.abc import Callable, Mapping, Sequence

import psutil

# GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, in the order they are exported.
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclasses.dataclass(frozen=True)
class Route:
    """The interface this host reaches the master through, and its own address on it."""

    interface: str
    address: str


def resolve(host: str) -> list[str]:
    """Every IPv4 address ``host`` resolves to here, in the resolver's order ([] if none)."""
    try:
        found = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def is_loopback(address: str) -> bool:
    """127.0.0.0/8 (and ::1): an address that never leaves this host."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def route_source(address: str) -> str | None:
    """This host's source address for packets to ``address`` (the kernel's route choice)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))  # UDP: nothing is sent, the route is looked up
            source: str = probe.getsockname()[0]
            return source
    except OSError:
        return None


def interfaces() -> dict[str, list[tuple[str, str]]]:
    """This network namespace's interfaces: name -> [(IPv4 address, netmask), ...]."""
    found: dict[str, list[tuple[str, str]]] = {}
    for name, addresses in psutil.net_if_addrs().items():
        found[name] = [
            (a.address, a.netmask or "") for a in addresses if a.family == socket.AF_INET
        ]
    return found


def interface_carrying(address: str, table: Mapping[str, Sequence[tuple[str, str]]]) -> str | None:
    """The interface that holds ``address`` (a loopback address: the loopback interface)."""
    for name, addresses in table.items():
        if any(own == address for own, _ in addresses):
            return name
    if is_loopback(address):
        return next((n for n, a in table.items() if any(is_loopback(own) for own, _ in a)), None)
    return None


def route_to(
    master_ip: str,
    table: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    source: Callable[[str], str | None] = route_source,
) -> Route | None:
    """The interface that reaches ``master_ip`` from here; None when nothing routes there."""
    table = interfaces() if table is None else table
    own = interface_carrying(master_ip, table)
    if own is not None:  # the master's own host: the interface the others reach it on
        return Route(own, master_ip)
    address = source(master_ip)
    name = None if address is None else interface_carrying(address, table)
    return None if name is None or address is None else Route(name, address)


def pick_named(candidates: str, table: Mapping[str, object]) -> str | None:
    """The first of ``"eth0,ens4"`` that exists here: one config for nodes named differently."""
    return next((n for n in (c.strip() for c in candidates.split(",")) if n in table), None)


def link_speed_mbps(interface: str) -> int:
    """The interface's link speed in Mb/s as the driver reports it; 0 when unknown (lo, tun)."""
    stats = psutil.net_if_stats().get(interface)
    return int(stats.speed) if stats is not None and stats.speed > 0 else 0
