"""`hpcddp check`'s output: one table, a row per rank, the measurements, one line per problem.

Pure text from the report `hpcddp.check.preflight` gathers and the problems
`hpcddp.check.checkup` finds, so what the user reads is tested on plain data.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from hpcddp.check.checkup import (
    Problem,
    by_host,
    model_memory,
    node_compute_ms,
    node_throttled,
)

COLUMNS = (
    "rank",
    "host",
    "local",
    "cpus",
    "gpu",
    "interface to master",
    "torch",
    "nccl",
    "cuda",
    "mem free",
    "disk free",
)


def _row(f: Mapping[str, Any]) -> list[str]:
    versions = f["versions"]
    numa = f.get("numa_node")  # pinned near its GPU: which node, which CPUs
    cpus = (
        f"{f['cpus']} (numa {numa}: {f.get('cpu_list', '')})"
        if numa is not None
        else str(f["cpus"])
    )
    gpu = f.get("gpu") or "-"  # its device and the UUID that tells it apart
    return [
        str(f["rank"]),
        f["host"],
        f"{f['local_rank']}/{f['local_world_size']}",
        cpus,
        gpu,
        f"{f['interface']} {f['address']}".strip() or "-",
        versions.get("torch") or "-",
        versions.get("nccl") or "-",
        versions.get("cuda") or "-",
        f"{f['mem_free_gb']:.1f} GB",
        f"{f['disk_free_gb']:.1f} GB",
    ]


def table(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-rank table, columns padded to their widest cell."""
    rows = [list(COLUMNS)] + [_row(f) for f in sorted(ranks, key=lambda f: f["rank"])]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def measurements(report: Mapping[str, Any]) -> list[str]:
    """The all-reduce, the node pairs and the compute times, a line each."""
    ar = report["allreduce"]
    link = f"{ar['link_gbps']:.3g} Gb/s" if ar.get("link_gbps") else "unknown"
    share = f", {100 * ar['bus_gbps'] / ar['link_gbps']:.2g}%" if ar.get("link_gbps") else ""
    lines = [
        f"all-reduce ({report['backend']}, {len(report['ranks'])} ranks): "
        f"{_size(ar['small_bytes'])} "
        f"in {ar['small_ms']:.3g} ms; {_size(ar['bytes'])} in {ar['ms']:.3g} ms = "
        f"{ar['bus_gbps']:.3g} Gb/s bus bandwidth (link reports {link}{share})"
    ]
    if report["pairs"]:
        shown = ", ".join(
            f"{p['src']} -> {p['dst']} " + (f"{p['gbps']:.3g} Gb/s" if p.get("gbps") else "FAILED")
            for p in report["pairs"]
        )
        lines.append(f"node pairs ({_size(report['pair_bytes'])} each way): {shown}")
    held = node_throttled(report["ranks"])
    compute = ", ".join(
        f"{host} {ms:.3g} ms" + (f" (CPU quota held it {held[host]:.0%})" if held[host] else "")
        for host, ms in node_compute_ms(report["ranks"]).items()
    )
    lines.append(f"compute ({report['compute_what']}, per batch, median rank per node): {compute}")
    judged = model_memory(report)
    if judged:
        lines.append(judged[0])
    elif report.get("model_unknown"):
        lines.append(f"model state per rank: not estimated ({report['model_unknown']})")
    return lines


def as_text(report: Mapping[str, Any], found: Sequence[Problem]) -> str:
    """Everything `hpcddp check` prints, in order."""
    ranks = report["ranks"]
    header = (
        f"hpcddp check: {len(ranks)} rank(s) on {len(by_host(ranks))} node(s), launcher "
        f"{ranks[0]['launcher']}, job {report['job_id'] or '-'}; rendezvous "
        f"{report['master_addr']}:{report['master_port']} served by rank 0, master reached at "
        f"{report['master_ip']}; backend {report['backend']}"
    )
    lines = [header, "", *table(ranks), "", *measurements(report), ""]
    errors = sum(p.severity == "error" for p in found)
    if not found:
        lines.append("no problems found: the job should train.")
    else:
        lines += [p.line() for p in found]
        verdict = "the job would not train" if errors else "the job would train"
        lines.append(f"{errors} error(s), {len(found) - errors} warning(s): {verdict}.")
    return "\n".join(lines)
