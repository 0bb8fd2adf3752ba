"""`hpcddp check`'s compute probe sees a CPU-throttled process (issue 17: it did not).

A CFS quota of 15% lets a process run 15 ms of every 100 ms period and stops it for the rest.
Emulated here without cgroups: the probe runs in a child that this test stops (SIGSTOP) and
continues (SIGCONT) on that duty cycle. This machine's cores are loaded and several times slower
than the node of issue 17 (whose probe batch took 5 ms), so the model is scaled: the period,
the quota and the probe's window are all stretched by (batch time here / 5 ms), keeping the
proportions that hid the throttle (a batch is a third of a quota). The real thing, a throttled
Slurm node, is tests/slurm/test_check.py::test_a_throttled_node_is_named.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.fixtures.helpers import REPO

PROBE = """
import inspect, sys, time, torch
from hpcddp.check import preflight
torch.set_num_threads(1)
a = torch.randn(384, 384)
bursts = []
for _ in range(5):  # issue 17's node measured 5 ms for this, the fastest of five
    start = time.perf_counter()
    for _ in range(8):
        torch.tanh(a @ a)
    bursts.append((time.perf_counter() - start) * 1000)
print("ready", min(bursts), flush=True)
scale = float(sys.stdin.readline())
probe = preflight._compute_ms
window = {"window_s": 0.3 * scale} if "window_s" in inspect.signature(probe).parameters else {}
print(probe(torch.device("cpu"), **window), flush=True)
"""
PERIOD_S, QUOTA_S = 0.100, 0.015
NODE_BURST_MS = 5.0  # issue 17's node: 384x384 matmul x8 in 5 ms


def probe_ms(throttled: bool, scale: float = 0.0) -> tuple[float, float]:
    """(the probe's figure, this machine's scale against issue 17's node)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", PROBE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout and child.stdin
    ready, burst_ms = child.stdout.readline().split()
    assert ready == "ready"
    scale = scale or max(float(burst_ms) / NODE_BURST_MS, 1.0)
    child.stdin.write(f"{scale}\n")
    child.stdin.flush()
    while throttled and child.poll() is None:
        time.sleep(QUOTA_S * scale)  # its quota for this period ...
        child.send_signal(signal.SIGSTOP)
        time.sleep((PERIOD_S - QUOTA_S) * scale)  # ... then stopped until the next one
        child.send_signal(signal.SIGCONT)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    return float(out.strip()), scale


@pytest.mark.quiet  # it times something: this test's own stop/continue timing must be kept
def test_the_probe_sees_a_process_throttled_to_15_percent():
    full, scale = probe_ms(throttled=False)
    throttled, _ = probe_ms(throttled=True, scale=scale)
    print(f"compute probe (x{scale:.2g} scale): {full:.3g} ms, {throttled:.3g} ms throttled to 15%")
    # the check warns at 3x (checkup.SLOW_COMPUTE_FACTOR); 15% of a core is ~6.7x slower
    assert throttled > 3 * full
