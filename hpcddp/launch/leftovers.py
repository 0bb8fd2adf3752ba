"""Launch variables that lie: a shell's leftovers and half of a launcher's set.

A rank that believes variables no launcher set for it waits 300 s for peers that do not exist,
or silently trains alone as rank 0 of a world of one. Two kinds are caught here:

- local-launch numbering (``HPCDDP_LOCAL_*``, ``SUBMITIT_LOCAL_*``) whose launcher is not an
  ancestor of this process: copied from a rank's environment into a shell, say. A genuine
  local launcher names itself (its pid) in the job id variable, so this is checked, not guessed;
- a partial torchrun-style set (``LOCAL_RANK`` or ``NODE_RANK`` or ``WORLD_SIZE`` without the
  rest), which says this process is one of many without saying which.
"""

import os
from collections.abc import Callable, Mapping, Sequence

import psutil

# The local launchers, the variable in which each names itself (its pid), and how far up the
# process tree it may be: ours forks ranks from its zygote (`hpcddp.launch.forked`); submitit's
# may start them through a shell.
LOCAL_LAUNCHERS = {
    "HPCDDP_LOCAL_": ("HPCDDP_LOCAL_JOB_ID", 2),  # hpcddp train --nproc
    "SUBMITIT_LOCAL_": ("SUBMITIT_LOCAL_JOB_ID", 2),  # submitit's local executor
}
# What torchrun sets together, plus NODE_RANK (Lightning's and others' node number); a value
# that says "rank 0 of one" is no claim to be part of a larger world.
TORCHRUN_SET = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")
_SINGLE_VALUES = {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "NODE_RANK": "0"}
_SINGLE_VALUES |= {"WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "::1")


def ancestor_pids(pid: int | None = None) -> list[int]:
    """The pids of this process's parent, grandparent, ..., nearest first ([] when unknown)."""
    try:
        return [p.pid for p in psutil.Process(pid or os.getpid()).parents()]
    except psutil.Error:
        return []


def split_leftovers(
    environ: Mapping[str, str], ancestors: Callable[[], Sequence[int]] = ancestor_pids
) -> tuple[dict[str, str], list[str]]:
    """``environ`` without local-launch variables whose launcher did not start this process;
    and those. The ancestors are looked up only when such variables are present."""
    kept, left = dict(environ), []
    for prefix, (job_var, depth) in LOCAL_LAUNCHERS.items():
        names = sorted(n for n in environ if n.startswith(prefix))
        if not names:
            continue
        launcher = environ.get(job_var, "")
        if launcher.isdigit() and int(launcher) in list(ancestors())[:depth]:
            continue
        left += names
        for name in names:
            kept.pop(name)
    return kept, left


def leftovers_message(environ: Mapping[str, str], names: list[str]) -> str:
    """Why a process with left-over local-launch variables is refused, and the fix."""
    shown = " ".join(f"{n}={environ[n]}" for n in names[:3]) + (" ..." if len(names) > 3 else "")
    job = next((environ[v] for v, _ in LOCAL_LAUNCHERS.values() if environ.get(v)), "")
    who = f"its launcher, pid {job}, did not" if job else "no launcher of it did"
    return (
        f"{shown} are set, but {who} start this process: they were left over from a "
        "local launch (copied into your shell?), and would make this process wait for peers "
        f"that do not exist. HINT: unset {' '.join(names)}, then launch with "
        "`hpcddp train --nproc N`, srun or torchrun."
    )


def partial_set(environ: Mapping[str, str]) -> list[str]:
    """torchrun-style variables that claim a place in a larger world, without the full set."""
    return [
        name
        for name in TORCHRUN_SET
        if environ.get(name) not in (None, "", _SINGLE_VALUES.get(name))
    ]


def partial_message(environ: Mapping[str, str], names: list[str]) -> str:
    """Why a partial launcher environment is refused, and the fix."""
    shown = " ".join(f"{n}={environ[n]}" for n in names)
    verb, kept = ("is", "it") if len(names) == 1 else ("are", "them")
    return (
        f"{shown} {verb} set, but not the rest of a launcher's variables (torchrun sets RANK, "
        "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT together), so this "
        "process cannot tell its place and would train alone as rank 0 of 1. HINT: unset "
        f"{' '.join(names)} if your shell kept {kept}; otherwise launch with torchrun, srun (one "
        "task per rank) or `hpcddp train --nproc N`."
    )


def is_loopback_name(host: str) -> bool:
    """``localhost``, ``127.x.y.z``, ``::1``: a master address that means "this node" everywhere."""
    return host.lower() in LOOPBACK_NAMES or host.startswith("127.")
