"""Every thread's stack of this process, into a file: py-spy where it can attach, else faulthandler.

py-spy reads the process from outside (ptrace), so it also shows native frames (the gloo or
NCCL call a thread sits in); it needs ptrace rights, which containers often withhold.
faulthandler writes the Python frames from inside, which works everywhere this thread runs.
`dump_stacks` is the one entry point; the hang watchdog (`hpcddp.comm.watchdog`) calls it.
"""

import faulthandler
import os
import pathlib
import shutil
import subprocess

PY_SPY_TIMEOUT_S = 30.0


def dump_stacks(path: pathlib.Path, header: str = "") -> str:
    """Write this process's stacks to ``path``; returns the tool that wrote them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    spied = _py_spy(os.getpid())
    with path.open("w") as out:
        if header:
            out.write(header.rstrip("\n") + "\n")
        if spied is not None:
            out.write(spied)
            return "py-spy"
        out.write("(py-spy could not attach; Python frames from faulthandler)\n")
        out.flush()
        faulthandler.dump_traceback(out, all_threads=True)
        return "faulthandler"


def _py_spy(pid: int) -> str | None:
    """py-spy's dump with native frames, or None if it is missing or may not attach."""
    tool = shutil.which("py-spy")
    if tool is None:
        return None
    for extra in (["--native"], []):  # native frames need symbols; plain Python otherwise
        try:
            done = subprocess.run(
                [tool, "dump", "--pid", str(pid), *extra],
                capture_output=True,
                text=True,
                timeout=PY_SPY_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout
    return None
