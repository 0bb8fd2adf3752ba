"""A fault in one rank's set-up, on the real cluster: the whole job ends soon, and the job's
output holds one line naming the rank, its host and the user's frame, and the user's traceback
once (not a gloo trace from every rank).

The one job also checks the job script's reading of its arguments: the config it is given is
named ``my=odd.yaml``, which must be taken as the config, not as an override.
"""

import re
import time

import pytest
import yaml

from tests.fixtures.helpers import ENDED, QUICKSTART, REPO, TINY, line_of

pytestmark = pytest.mark.slow


def test_a_setup_fault_on_one_rank_of_two_nodes_is_told_once(slurm_cluster, tmp_path):
    config = yaml.safe_load((REPO / QUICKSTART).read_text())
    config["model"] = {
        "factory": "tests.fixtures.faulty_setup:make_model",
        "kwargs": {"fail_on_rank": 2},
    }
    config["run"]["dir"] = str(tmp_path / "run")
    odd = tmp_path / "my=odd.yaml"
    odd.write_text(yaml.safe_dump(config))
    since = time.monotonic()
    job_id, _ = slurm_cluster.sbatch(
        tmp_path,
        "sbatch/train.sh",
        str(odd),
        *TINY,
        options=("--job-name=setup-fault", "--nodes=2", "--ntasks-per-node=2"),
        wait=False,
    )
    try:
        state = slurm_cluster.wait_for(job_id, ENDED, timeout=300)
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    took = time.monotonic() - since
    output = slurm_cluster.output(tmp_path, job_id)
    assert state == "FAILED", output[-4000:]
    assert took < 120, f"the job took {took:.0f} s to end"  # no rank waited for a timeout
    host = slurm_cluster.ranks_on(2, 2)[2]
    errors = [line for line in output.splitlines() if line.startswith("hpcddp: error: ")]
    frame = line_of("tests/fixtures/faulty_setup.py", "raise ValueError")
    assert errors == [
        "hpcddp: error: the model factory tests.fixtures.faulty_setup:make_model raised on rank 2 "
        f"({host}): ValueError: width 255 must be even at {frame} in check_width. HINT: fix "
        "your code there; the traceback, trimmed to your code, is in RUN_DIR/logs/rank-2.log "
        "and above."
    ], output[-4000:]
    assert output.count("Traceback (most recent call last)") == 1, output[-4000:]
    frames = [line for line in output.splitlines() if line.lstrip().startswith('File "')]
    assert frames and all("/hpcddp/" not in frame for frame in frames), frames
    assert not re.search(r"ProcessGroup|Connection (closed|reset)|c10d", output), output[-4000:]
