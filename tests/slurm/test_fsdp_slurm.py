"""dist.strategy=fsdp on the real cluster: a 2-node sharded job preempted once (USR2 to the
batch shell, as --signal=B:USR2 sends before the time limit) is requeued, resumes from every
rank's shards, and ends bitwise equal to an uninterrupted 4-rank fsdp run on this machine."""

import concurrent.futures

import pytest

from tests.fixtures.helpers import run_cli, summary, wait_for_step, wait_until

pytestmark = pytest.mark.slow
CONFIG = "tests/fixtures/sharded_transformer.yaml"
LONGER = ["train.epochs=30", "train.checkpoint_every_steps=20"]  # 120 steps: time to signal


def test_fsdp_job_preempted_once_ends_as_an_uninterrupted_run(slurm_cluster, tmp_path):
    straight = tmp_path / "straight"
    # the uninterrupted run trains here while the job below waits on its stop and requeue
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reference = pool.submit(
            run_cli, "train", CONFIG, f"run.dir={straight}", *LONGER, "--nproc", "4", timeout=600
        )
        preempted_once(slurm_cluster, tmp_path)
        result = reference.result()
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "preempted"
    assert any((run_dir / "checkpoints").glob("step-*.dcp"))
    got, expected = summary(run_dir), summary(straight)
    assert got["steps"] == expected["steps"] == 120
    assert got["weights_sha256"] == expected["weights_sha256"]


def preempted_once(slurm_cluster, tmp_path) -> None:
    """The job, stopped once by USR2 at step 30 or later, requeued and run to its end."""
    run_dir = tmp_path / "preempted"
    job_id = slurm_cluster.run(
        "sbatch", "--parsable", f"--output={tmp_path}/%x-%j.out", "--job-name=fsdp",
        "--nodes=2", "--ntasks-per-node=2", "sbatch/train.sh", CONFIG, f"run.dir={run_dir}",
        *LONGER,
    ).stdout.strip()  # fmt: skip
    try:
        wait_for_step(run_dir, 30, timeout=240)
        slurm_cluster.run("scancel", "--signal=USR2", "--batch", job_id)
        wait_until(
            lambda: (
                "Restarts=1" in slurm_cluster.run("scontrol", "-o", "show", "job", job_id).stdout
            ),
            "the requeue",
            timeout=180,
        )
        slurm_cluster.wait_for(job_id, {"PENDING"}, timeout=60)
        slurm_cluster.release(job_id)  # a requeued job is held ~120 s (BeginTime)
        final = slurm_cluster.wait_for(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        output = slurm_cluster.output(tmp_path, job_id)
        assert final == "COMPLETED", output[-4000:]
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    assert "requeued" in output
