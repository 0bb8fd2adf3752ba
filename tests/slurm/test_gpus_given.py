"""GPUs Slurm gave are GPUs used, on the real cluster: a step whose environment says Slurm gave
the job GPUs (SLURM_JOB_GPUS, exported as a GPU node's Slurm sets it), run with this machine's
CPU-only torch, is refused on every rank with the reason, by `hpcddp check` and by training
alike, instead of training on CPU."""

import sys

import pytest

from tests.fixtures.helpers import QUICKSTART, TINY

pytestmark = pytest.mark.slow

GAVE = {"SLURM_JOB_GPUS": "0"}
REASON = (
    "Slurm gave this job GPUs (SLURM_JOB_GPUS=0) but this rank sees none through torch, so it "
    "would train on CPU: this torch is a CPU-only build"
)


@pytest.mark.parametrize("command", ["check", "train"])
def test_ranks_slurm_gave_gpus_that_see_none_are_refused_with_the_reason(
    slurm_cluster, tmp_path, command
):
    done = slurm_cluster.run(
        "srun",
        "--kill-on-bad-exit=1",
        "--nodes=2",
        "--ntasks-per-node=1",
        sys.executable,
        "-m",
        "hpcddp",
        command,
        QUICKSTART,
        f"run.dir={tmp_path / 'run'}",
        *(TINY if command == "train" else []),
        timeout=300,
        check=False,
        extra_env=GAVE,
    )
    assert done.returncode != 0
    assert done.stderr.count(REASON) == 1, done.stderr  # told once, for every rank
    assert "HPCDDP_DEVICE=cpu" in done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
