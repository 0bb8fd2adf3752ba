"""How long a CPU quota (a cgroup's CFS bandwidth limit) held this process back.

A node throttled to a fraction of a core runs bursts at full speed and then stands still until
the next period; on a machine whose cores are also shared, timing alone can hardly tell that
from contention. The kernel counts it: each cgroup's ``cpu.stat`` has the time its tasks were
throttled (v1 ``throttled_time`` in ns, v2 ``throttled_usec``). A limit may sit on any
ancestor of the process's cgroup, so every readable level is asked and the most throttled
counts. Reads files only: no torch, nothing to install.
"""

import pathlib
from collections.abc import Sequence

CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")


def cgroup_dirs(proc_cgroup: str, root: pathlib.Path = CGROUP_ROOT) -> list[pathlib.Path]:
    """The CPU controller's folders of a process, its own first, then each ancestor.

    ``proc_cgroup`` is the text of ``/proc/self/cgroup``: ``0::/path`` under cgroup v2, or
    ``N:cpu,cpuacct:/path`` lines under v1.
    """
    for line in proc_cgroup.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "" and (root / "cgroup.controllers").exists():
            base = root  # the unified (v2) hierarchy
        elif "cpu" in controllers.split(","):
            base = next((root / n for n in ("cpu", "cpu,cpuacct") if (root / n).is_dir()), root)
        else:
            continue
        own = base / path.strip().lstrip("/")
        return [own, *[p for p in own.parents if base in (p, *p.parents)]]
    return []


def _throttled_s(folder: pathlib.Path) -> float:
    try:
        lines = (folder / "cpu.stat").read_text().splitlines()
    except OSError:
        return 0.0
    stats = dict(line.split(maxsplit=1) for line in lines if " " in line)
    if "throttled_usec" in stats:
        return int(stats["throttled_usec"]) / 1e6
    return int(stats.get("throttled_time", 0)) / 1e9


def throttled_s(dirs: Sequence[pathlib.Path]) -> float:
    """Seconds throttled so far at the most throttled level (0 where nothing can be read)."""
    return max((_throttled_s(folder) for folder in dirs), default=0.0)


def _limit_cpus(folder: pathlib.Path) -> float:
    """The CPUs a folder's quota allows (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``); 0: none."""
    try:
        if (folder / "cpu.max").exists():
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        else:
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
    except (OSError, ValueError):
        return 0.0
    if quota in ("max", "-1") or not quota.lstrip("-").isdigit() or not period.isdigit():
        return 0.0
    return int(quota) / max(int(period), 1)


def limit_cpus(dirs: Sequence[pathlib.Path]) -> float:
    """The tightest CPU quota on the way up, in CPUs (0.15: 15 ms of every 100 ms); 0: none."""
    limits = [limit for limit in map(_limit_cpus, dirs) if limit > 0]
    return min(limits, default=0.0)


def own_dirs() -> list[pathlib.Path]:
    """This process's CPU cgroup folders (none where there is no cgroup file system)."""
    try:
        return cgroup_dirs(pathlib.Path("/proc/self/cgroup").read_text())
    except OSError:
        return []
