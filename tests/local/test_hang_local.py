"""A hung rank under `hpcddp train --nproc`: found, named once by the launcher, ended as HUNG.

Rank 1 sleeps forever in its forward (`tests.fixtures.hang_node`) while rank 0 waits for it in
DDP's all-reduce; with ``dist.hang_timeout_s=5`` both watchdogs write their stacks and agree
through the store that rank 1 is the one behind.
"""

import json
import re
import socket

import pytest

from hpcddp import exit_codes
from hpcddp.records import attempts
from tests.fixtures.helpers import QUICK, QUICKSTART, run_cli

pytestmark = pytest.mark.slow


def test_a_rank_hung_outside_any_collective_is_named_with_every_ranks_stacks(tmp_path):
    run_dir, host_file = tmp_path / "run", tmp_path / "hang-host"
    host_file.write_text(socket.gethostname())
    result = run_cli(
        "train", QUICKSTART, f"run.dir={run_dir}", *QUICK, "dist.hang_timeout_s=5",
        "model.factory=tests.fixtures.hang_node:make_model",
        f"model.kwargs={{host_file: {host_file}, at_call: 6, rank: 1}}", "--nproc", "2",
        timeout=180,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == exit_codes.HUNG, output[-3000:]
    stacks = attempts.hang_dir(run_dir, "", 0)
    named = re.findall(r"hang: rank 1 on \S+ after step 5 \(at \S+hang_node\.py:\d+ in "
                       r"sleep_forever\).*", output)  # fmt: skip
    assert len(named) == 1 and f"stacks are in {stacks}" in named[0], output[-3000:]
    assert "lost contact" not in output  # the cause is told, not its consequence
    assert "sleep_forever" in (stacks / "rank-1.txt").read_text()
    assert "backward" in (stacks / "rank-0.txt").read_text()  # waiting in DDP's all-reduce
    verdict = json.loads((stacks / "verdict.json").read_text())
    assert verdict["ranks"] == [1] and verdict["silent"] == []
