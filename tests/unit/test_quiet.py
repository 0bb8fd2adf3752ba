"""The c10d warning nobody can act on is kept out of stderr; everything else passes."""

import subprocess
import sys

SCRIPT = """
import os, sys
from hpcddp.comm.quiet import c10d_noise_filtered
NOISE = b"The hostname of the client socket cannot be retrieved."
os.write(2, b"before\\n")
with c10d_noise_filtered():
    # what torch's C++ writes to file descriptor 2 when a store client connects
    os.write(2, b"[W socket.cpp:207] [c10d] " + NOISE + b" err=-3\\n")
    os.write(2, b"a real warning\\n")
    print("from python", file=sys.stderr, flush=True)
os.write(2, b"after\\n")
"""


def test_only_the_noise_is_filtered_and_stderr_comes_back():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0
    assert done.stderr.splitlines() == ["before", "a real warning", "from python", "after"]
