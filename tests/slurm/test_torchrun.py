"""`sbatch/train-torchrun.sh` on the real cluster: the same weights as `sbatch/train.sh`.

The same config at the same world size must train to the same weights whichever launcher
numbered the ranks, so a torchrun job (one task per node) is checked against an srun job
(one task per rank) bit for bit, whole (ddp) and sharded (fsdp).
"""

import sys

import pytest

from tests.fixtures.helpers import ENDED, QUICK, REPO, SHARDED, summary

STRATEGIES = {"ddp": [], "fsdp": SHARDED}  # each one's config overrides
CHECKPOINT = {"ddp": ".pt", "fsdp": ".dcp"}  # whole, or every rank's shards


def submit(cluster, tmp_path, script: str, run_dir, *options: str, overrides=()) -> str:
    """Submit ``script`` with the quick config (and ``overrides``) into ``run_dir``; return the
    job id."""
    done = cluster.run(
        "sbatch",
        "--parsable",
        f"--output={tmp_path}/%x-%j.out",
        f"--export=ALL,HPCDDP_PYTHON={sys.executable}",
        *options,
        script,
        "examples/quickstart.yaml",
        f"run.dir={run_dir}",
        *QUICK,
        *overrides,
        cwd=REPO,
    )
    return done.stdout.strip().split(";")[0]


def finish(cluster, tmp_path, job_id: str) -> str:
    """Wait for the job; return its output, or fail with it."""
    state = cluster.wait_for(job_id, ENDED, timeout=180)
    log = next(tmp_path.glob(f"*-{job_id}.out"), None)
    output = log.read_text() if log else "(no output file)"
    assert state == "COMPLETED", f"job {job_id} {state}:\n{output[-4000:]}"
    return output


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_torchrun_two_nodes_matches_srun_weights(slurm_cluster, tmp_path, strategy):
    # Both jobs fit on the cluster at once (2 CPUs per node each), so they run side by side.
    torchrun_job = submit(
        slurm_cluster,
        tmp_path,
        "sbatch/train-torchrun.sh",
        tmp_path / "torchrun",
        "--nodes=2",
        "--cpus-per-task=2",  # one rank per CPU of the node's task: 2 per node
        "--job-name=itest-torchrun",
        overrides=STRATEGIES[strategy],
    )
    srun_job = submit(
        slurm_cluster,
        tmp_path,
        "sbatch/train.sh",
        tmp_path / "srun",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--job-name=itest-srun",
        overrides=STRATEGIES[strategy],
    )
    output = finish(slurm_cluster, tmp_path, torchrun_job)
    finish(slurm_cluster, tmp_path, srun_job)

    hosts = slurm_cluster.job_hosts(torchrun_job)
    assert len(hosts) == 2
    torchrun, srun = summary(tmp_path / "torchrun"), summary(tmp_path / "srun")
    assert torchrun["world_size"] == 4 and torchrun["launcher"] == "torchrun"
    assert torchrun["job_id"] == torchrun_job
    assert sorted(torchrun["hosts"]) == sorted(hosts * 2)  # two processes on each node
    assert f"2 nodes x 2 processes, rendezvous {hosts[0]}:" in output
    assert srun["world_size"] == 4 and srun["launcher"] == "slurm"
    assert torchrun["steps"] == srun["steps"]
    assert torchrun["weights_sha256"] == srun["weights_sha256"]
    for run in ("torchrun", "srun"):
        written = {c.suffix for c in (tmp_path / run / "checkpoints").iterdir()}
        assert written & set(CHECKPOINT.values()) == {CHECKPOINT[strategy]}, (run, written)
