"""`hpcddp check`'s judgement: every rank's facts and the measurements in, problems and a table out.

Pure logic on plain data (the rank side, `hpcddp.check.preflight`, gathers it), so every rule is
unit-tested on dictionaries. A problem is an ``error`` when the job would not train (exit
status 1) and a ``warning`` when it would, badly or fragilely; each says what was seen and
ends with the fix.
"""

import collections
import dataclasses
import ipaddress
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hpcddp.check import memory
from hpcddp.launch import gpus, hostlist

EPHEMERAL = range(32768, 61000)
MIN_FREE_MEMORY_GB = 1.0
MIN_FREE_DISK_GB = 2.0
SLOW_FACTOR = 4.0  # a link this many times slower than the others is named
SLOW_COMPUTE_FACTOR = 3.0
# A node whose ranks a CPU quota held back this share of the probe's time, and this much slower
THROTTLED_SHARE = 0.25
QUOTA_SLOW_FACTOR = 1.0  # with that evidence, any node slower than the fastest
QUOTA_CPUS_PER_RANK = 0.5  # a quota under half a CPU per rank starves them


@dataclasses.dataclass(frozen=True)
class Problem:
    """One finding: ``error`` (the job would not train) or ``warning``; the text ends with a fix."""

    severity: str
    text: str

    def line(self) -> str:
        return f"{self.severity}: {self.text}"


Facts = Mapping[str, Any]  # one rank's facts (see `hpcddp.check.preflight.rank_facts`)


def by_host(ranks: Sequence[Facts]) -> dict[str, list[Facts]]:
    """Ranks grouped by host, hosts in the order of their first rank."""
    grouped: dict[str, list[Facts]] = collections.defaultdict(list)
    for facts in sorted(ranks, key=lambda f: f["rank"]):
        grouped[facts["host"]].append(facts)
    return dict(grouped)


def _hosts(names: Sequence[str]) -> str:
    try:
        return hostlist.compress(names)
    except Exception:  # a name hostlist cannot hold: list them plainly
        return ",".join(names)


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


# -- name resolution --------------------------------------------------------------------------


def own_name_problems(ranks: Sequence[Facts]) -> list[Problem]:
    """Nodes whose own name resolves to loopback (Debian's ``127.0.1.1 <hostname>`` line)."""
    looped = {h: f[0]["own_name"] for h, f in by_host(ranks).items() if f[0]["own_name"]}
    looped = {h: addrs for h, addrs in looped.items() if all(map(_loopback, addrs))}
    if not looped or len(by_host(ranks)) < 2:
        return []
    seen = sorted({a for addrs in looped.values() for a in addrs})
    return [
        Problem(
            "warning",
            f"{_hosts(list(looped))} resolve their own names to {', '.join(seen)} (Debian's "
            "127.0.1.1 line): hpcddp binds gloo/NCCL to the interface that routes to the master "
            "itself, but tools that trust the hostname (plain torchrun, gloo without "
            "GLOO_SOCKET_IFNAME) advertise loopback and fail. Fix: give each node's name its "
            "cluster address in /etc/hosts or DNS.",
        )
    ]


def master_problems(ranks: Sequence[Facts], master_ip: str) -> list[Problem]:
    """The master's name must resolve, everywhere but on its own node, to an address it holds."""
    hosts = by_host(ranks)
    master_host = min(ranks, key=lambda f: f["rank"])["host"]
    held = {a for addrs in hosts[master_host][0]["interfaces"].values() for a in addrs}
    name = ranks[0]["master_addr"]
    problems = []
    wrong = {
        h: f[0]["master_resolves"]
        for h, f in hosts.items()
        if h != master_host and not set(f[0]["master_resolves"][:1]) & held
    }
    if wrong:
        seen = "; ".join(f"{h}: {', '.join(a) or 'nothing'}" for h, a in wrong.items())
        problems.append(
            Problem(
                "error",
                f"MASTER_ADDR={name} resolves to an address {master_host} does not hold on "
                f"{_hosts(list(wrong))} ({seen}). Fix: correct /etc/hosts or DNS there, or "
                f"export MASTER_ADDR={master_ip}.",
            )
        )
    answers = {tuple(f[0]["master_resolves"][:1]) for h, f in hosts.items() if h != master_host}
    if len(answers) > 1 and not wrong:
        problems.append(
            Problem(
                "warning",
                f"MASTER_ADDR={name} resolves to different addresses on different nodes "
                f"({', '.join(a[0] for a in sorted(answers) if a)}). Fix: give it one address "
                f"in DNS, or export MASTER_ADDR={master_ip}.",
            )
        )
    return problems


def port_problems(port: int, explicit: bool) -> list[Problem]:
    """A MASTER_PORT chosen by hand inside Linux's ephemeral range collides at random."""
    if explicit and port in EPHEMERAL:
        return [
            Problem(
                "warning",
                f"MASTER_PORT={port} is in Linux's ephemeral range (32768-60999), which the "
                "kernel hands to outgoing connections: it may be taken when the job starts. "
                "Fix: unset MASTER_PORT (hpcddp derives one per job step) or pick 20000-32767.",
            )
        ]
    return []


# -- software ----------------------------------------------------------------------------------


def version_problems(ranks: Sequence[Facts]) -> list[Problem]:
    """torch, hpcddp and Python must match on every node; CUDA and NCCL should."""
    problems = []
    for name, severity in (("torch", "error"), ("hpcddp", "error"), ("python", "error")):
        problems += _mismatch(ranks, name, severity)
    for name in ("cuda", "nccl"):
        problems += _mismatch(ranks, name, "warning")
    return problems


def _mismatch(ranks: Sequence[Facts], name: str, severity: str) -> list[Problem]:
    seen: dict[str, list[str]] = collections.defaultdict(list)
    for host, facts in by_host(ranks).items():
        seen[str(facts[0]["versions"].get(name) or "none")].append(host)
    if len(seen) < 2:
        return []
    listed = "; ".join(f"{v} on {_hosts(hosts)}" for v, hosts in seen.items())
    return [
        Problem(
            severity,
            f"{name} differs between nodes ({listed}): ranks must run the same software. "
            "Fix: install the same environment on every node (one venv or container image on a "
            "shared file system).",
        )
    ]


# -- devices and CPUs ------------------------------------------------------------------------


def _views(facts: Sequence[Facts]) -> list[gpus.View]:
    """The ranks' GPUs as the rendezvous saw them (`hpcddp.launch.gpus`)."""
    return [
        gpus.View(
            f["rank"],
            f["host"],
            f["local_rank"],
            tuple(
                gpus.Gpu(i, uuid, "", bus)
                for i, (uuid, bus) in enumerate(
                    _uuids_and_buses(f.get("gpu_uuids") or [], f.get("gpu_bus_ids") or [])
                )
            ),
            f.get("gpu_index"),
        )
        for f in facts
    ]


def _uuids_and_buses(uuids: Sequence[str], buses: Sequence[str]) -> list[tuple[str, str]]:
    """Each GPU's UUID and PCI bus id ("" where a rank's facts do not give it)."""
    return [(uuid, buses[i] if i < len(buses) else "") for i, uuid in enumerate(uuids)]


def gpu_problems(ranks: Sequence[Facts], backend: str, gpus_asked: int) -> list[Problem]:
    """Ranks on one GPU (by host and bus id: the rendezvous's rule), GPUs left idle, GPUs asked
    but unseen."""
    problems = []
    views = _views(ranks)
    chosen = {v.rank: v.index for v in views if v.index is not None}
    if backend == "nccl":
        problems += [
            Problem("error", gpus.sharing_message(g, who))
            for g, who in gpus.shared(views, chosen, physical=True)
        ]
    for host, facts in by_host(ranks).items():
        visible = {u for f in facts for u in f.get("gpu_uuids") or []}
        used = {f["gpu_uuids"][f["gpu_index"]] for f in facts if f.get("gpu_index") is not None}
        if gpus_asked and facts[0]["gpus_visible"] == 0:
            problems.append(
                Problem(
                    "error",
                    f"{host}: slurm.gpus_per_node={gpus_asked} but its ranks see no GPU. Fix: "
                    "check CUDA_VISIBLE_DEVICES and the driver there (nvidia-smi), or "
                    "--gpus-per-node.",
                )
            )
        elif used and len(visible) > len(used):
            problems.append(
                Problem(
                    "warning",
                    f"{host}: {len(visible)} GPUs visible to {len(facts)} rank(s): "
                    f"{len(visible) - len(used)} stay idle. Fix: "
                    f"--ntasks-per-node={len(visible)}, or ask for {len(used)} GPU(s).",
                )
            )
    return problems


def cpu_problems(ranks: Sequence[Facts]) -> list[Problem]:
    """DataLoader workers against a rank's CPUs; the ``SRUN_CPUS_PER_TASK`` pitfall."""
    problems = []
    for host, facts in by_host(ranks).items():
        f = facts[0]
        asked = f["slurm_cpus_per_task"]
        if f["launcher"] == "slurm" and asked and f["cpus"] < asked and not f["srun_cpus_per_task"]:
            problems.append(
                Problem(
                    "warning",
                    f"{host}: the job asked --cpus-per-task={asked} but each rank got {f['cpus']} "
                    "CPU(s): since Slurm 22.05 srun does not inherit it. Fix: export "
                    "SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK before srun (hpcddp's job "
                    "scripts do), or srun --cpus-per-task.",
                )
            )
        elif f["workers"] >= f["cpus"] > 0 and f["workers"] > 0:
            problems.append(
                Problem(
                    "warning",
                    f"{host}: data.num_workers gives each rank {f['workers']} loader worker(s) "
                    f"on {f['cpus']} CPU(s), so loaders and training fight for them. Fix: "
                    "data.num_workers=-1 (CPUs minus one), or more --cpus-per-task.",
                )
            )
    return problems


def resource_problems(ranks: Sequence[Facts]) -> list[Problem]:
    """Free memory and disk; a run directory that other nodes cannot see."""
    problems = []
    for host, facts in by_host(ranks).items():
        f = facts[0]
        if f["mem_free_gb"] < MIN_FREE_MEMORY_GB:
            problems.append(
                Problem(
                    "warning",
                    f"{host}: {f['mem_free_gb']:.1f} GB of memory free. Fix: --mem, or find "
                    "what else runs there.",
                )
            )
        if f["disk_free_gb"] < MIN_FREE_DISK_GB:
            problems.append(
                Problem(
                    "warning",
                    f"{host}: {f['disk_free_gb']:.1f} GB free where run.dir is: checkpoints may "
                    "not fit. Fix: free space, or set run.dir on a larger file system.",
                )
            )
    blind = [h for h, facts in by_host(ranks).items() if not facts[0]["sees_run_dir"]]
    if blind:
        problems.append(
            Problem(
                "error",
                f"{_hosts(blind)} cannot see the files rank 0 writes in run.dir "
                f"({ranks[0]['run_dir']}): resume and checkpoints need one directory every "
                "node shares. Fix: set run.dir on a shared file system.",
            )
        )
    return problems


# -- speed -------------------------------------------------------------------------------------


def pair_problems(pairs: Sequence[Mapping[str, Any]]) -> list[Problem]:
    """Name the node whose transfers are several times slower than the others'.

    A direction ``a -> b`` is slow when it runs ``SLOW_FACTOR`` times below the fastest one;
    the node that sends in every slow direction (or receives in every one) is named. With two
    nodes the sender is named and the receiver given as the other possibility.
    """
    measured = [p for p in pairs if p.get("gbps")]
    failed = [p for p in pairs if not p.get("gbps")]
    problems = [
        Problem(
            "error",
            f"no data went from {p['src']} to {p['dst']} ({p.get('error', 'failed')}). Fix: "
            f"exclude {p['src']} or {p['dst']} (--exclude) and report it to the admins.",
        )
        for p in failed
    ]
    if len(measured) < 2:
        return problems
    best = max(p["gbps"] for p in measured)
    slow = [p for p in measured if p["gbps"] * SLOW_FACTOR < best]
    if not slow:
        return problems
    senders = {p["src"] for p in slow}
    receivers = {p["dst"] for p in slow}
    node = next(iter(senders)) if len(senders) == 1 else next(iter(receivers), "")
    side = "outgoing" if len(senders) == 1 else "incoming"
    one_pair = len(senders) == len(receivers) == 1
    other = f" (or {next(iter(receivers))}'s incoming)" if one_pair else ""
    shown = ", ".join(f"{p['src']} -> {p['dst']} {p['gbps']:.3g} Gb/s" for p in slow)
    problems.append(
        Problem(
            "warning",
            f"slow node {node}: {shown}, against {best:.3g} Gb/s for the fastest pair; "
            f"{node}'s {side} link{other} is slow. Fix: exclude it (--exclude={node}) and "
            "report it to the admins.",
        )
    )
    return problems


def node_compute_ms(ranks: Sequence[Facts]) -> dict[str, float]:
    """Each node's median rank time: one rank's bad moment does not make a node slow."""
    return {
        host: statistics.median(f["compute_ms"] for f in facts)
        for host, facts in by_host(ranks).items()
    }


def node_throttled(ranks: Sequence[Facts]) -> dict[str, float]:
    """Each node's largest share of the probe that a CPU quota held a rank back (0: none)."""
    return {
        host: max(f.get("compute_throttled", 0.0) for f in facts)
        for host, facts in by_host(ranks).items()
    }


def _quota_why(facts: Sequence[Facts], held: float) -> str:
    """Why a CPU quota makes this node slow, if it does: its ranks held back for a good share
    of the probe, or a quota too small for its ranks at all (on a busy machine it may not
    even bind while the probe runs; it will when the job trains)."""
    limits = [f.get("cpu_quota", 0.0) for f in facts if f.get("cpu_quota", 0.0)]
    if limits and min(limits) < QUOTA_CPUS_PER_RANK * len(facts):
        return f"; its CPU quota (cgroup) allows {min(limits):.2g} CPUs for its {len(facts)} ranks"
    if held >= THROTTLED_SHARE:
        return f"; a CPU quota (cgroup) stopped its ranks for {held:.0%} of the probe"
    return ""


def compute_problems(ranks: Sequence[Facts]) -> list[Problem]:
    """A node whose ranks compute several times slower than the fastest node's, or slower and
    held back by a CPU quota (the kernel's count, `hpcddp.check.cpu_quota`) for a good part of
    the probe: on shared cores a throttle may cost less than 3x, and it is still a throttle."""
    times = node_compute_ms(ranks)
    if len(times) < 2:
        return []
    held = node_throttled(ranks)
    fastest = min(times.values())
    problems = []
    for host, facts in by_host(ranks).items():
        ms, why = times[host], _quota_why(facts, held[host])
        if not (ms > SLOW_COMPUTE_FACTOR * fastest or (why and ms > QUOTA_SLOW_FACTOR * fastest)):
            continue
        problems.append(
            Problem(
                "warning",
                f"slow node {host}: the same computation takes {ms:.3g} ms there against "
                f"{fastest:.3g} ms on the fastest node{why} (CPU throttled, shared or clocked "
                f"down?). Fix: exclude it (--exclude={host}) and report it to the admins.",
            )
        )
    return problems


def link_problems(allreduce: Mapping[str, Any]) -> list[Problem]:
    """The all-reduce's bus bandwidth against what the link should give."""
    link, bus = allreduce.get("link_gbps") or 0, allreduce.get("bus_gbps") or 0
    if not link or not bus or bus * 4 >= link:
        return []
    return [
        Problem(
            "warning",
            f"the all-reduce reaches {bus:.3g} Gb/s of bus bandwidth, {100 * bus / link:.2g}% of "
            f"the {link:.3g} Gb/s the slowest link reports. Fix: see the node pairs above (a "
            "slow node slows everyone), and the interface each rank uses.",
        )
    ]


# -- the model's memory ------------------------------------------------------------------------


def model_memory(report: Mapping[str, Any]) -> tuple[str, Problem | None] | None:
    """The line saying what each rank needs for the model's state under ddp and fsdp, against
    the smallest room a rank has (its GPU's free memory, or its node's RAM shared by its local
    ranks), and a problem when the configured strategy does not fit; None without a model."""
    model = report.get("model")
    if not model:
        return None
    ranks = report["ranks"]
    world, strategy = len(ranks), report["strategy"]
    model = dict(model)
    whole = model.pop("fsdp_builds_whole", False) and strategy == "fsdp"
    needs = memory.need(memory.ModelSize(**model), world, report["precision"])
    tightest = min(ranks, key=lambda f: f["model_room_bytes"])
    room = tightest["model_room_bytes"]
    judged, fails = memory.verdict(needs, room, strategy)
    line = (
        f"model state per rank ({model['params']:,} parameters; weights, gradients, AdamW "
        f"moments; activations not estimated): ddp {memory.gb(needs.ddp)}, fsdp "
        f"{memory.gb(needs.fsdp)} at {world} ranks; {tightest['host']} has {memory.gb(room)} "
        f"{tightest['model_room_kind']} per rank; dist.strategy={strategy} {judged}"
    )
    if whole:  # not on the meta device (dist.fsdp_meta_init): a whole replica first, in RAM
        weights = memory.gb(model["params"] * model["param_bytes"])
        line += f"; fsdp builds it whole first: {weights} of host memory a rank while it starts"
    problem = None
    if fails:
        fix = (
            "Fix: set dist.strategy=fsdp"
            if "set dist.strategy=fsdp" in judged
            else "Fix: more ranks (fsdp shares the state among them), a smaller model, or "
            "GPUs with more memory"
        )
        problem = Problem(
            "error",
            f"the model's state needs {memory.gb(needs.ddp if strategy == 'ddp' else needs.fsdp)}"
            f" per rank under dist.strategy={strategy}, before activations, and "
            f"{tightest['host']} has {memory.gb(room)} {tightest['model_room_kind']} per rank: "
            f"{judged}. {fix}.",
        )
    return line, problem


def model_problems(report: Mapping[str, Any]) -> list[Problem]:
    judged = model_memory(report)
    return [judged[1]] if judged and judged[1] else []


# -- all of it ---------------------------------------------------------------------------------


def merge_hosts(found: Sequence[Problem], hosts: Sequence[str]) -> list[Problem]:
    """One line for a problem several nodes share: ``n[1-4]: ...`` rather than four lines."""
    merged: dict[tuple[str, str], list[str]] = {}
    for problem in found:
        host, sep, rest = problem.text.partition(": ")
        key = (problem.severity, rest if sep and host in hosts else problem.text)
        merged.setdefault(key, []).extend([host] if sep and host in hosts else [])
    return [
        Problem(severity, f"{_hosts(names)}: {text}" if names else text)
        for (severity, text), names in merged.items()
    ]


def problems(report: Mapping[str, Any]) -> list[Problem]:
    """Every problem, errors first, one line each."""
    ranks = report["ranks"]
    rules: list[Callable[[], list[Problem]]] = [
        lambda: master_problems(ranks, report["master_ip"]),
        lambda: own_name_problems(ranks),
        lambda: port_problems(report["master_port"], report["port_explicit"]),
        lambda: version_problems(ranks),
        lambda: gpu_problems(ranks, report["backend"], report["gpus_asked"]),
        lambda: cpu_problems(ranks),
        lambda: resource_problems(ranks),
        lambda: link_problems(report["allreduce"]),
        lambda: pair_problems(report["pairs"]),
        lambda: compute_problems(ranks),
        lambda: model_problems(report),
    ]
    found = merge_hosts([p for rule in rules for p in rule()], list(by_host(ranks)))
    return sorted(found, key=lambda p: p.severity != "error")
