"""The job's own time limit on the real cluster: too short to hold the stop margin is refused
(never an endless requeue); a stale end time and a user's SLURM_TIME_FORMAT change nothing."""

import time

import pytest

from tests.fixtures.helpers import QUICK, TINY

pytestmark = pytest.mark.slow


def test_a_time_limit_shorter_than_the_stop_margin_is_refused_not_requeued(slurm_cluster, tmp_path):
    job_id, _ = slurm_cluster.sbatch(
        tmp_path,
        "sbatch/train.sh",
        "examples/quickstart.yaml",
        f"run.dir={tmp_path / 'run'}",
        *TINY,
        # a minute of time, the default 120 s stop margin; the signal late, to see the guard
        options=("--time=1", "--signal=B:USR2@5", "--job-name=short"),
        wait=False,
    )
    try:
        state = slurm_cluster.wait_for(job_id, {"COMPLETED", "FAILED", "PENDING"}, timeout=120)
        if state == "PENDING":  # not yet started, or requeued: wait for a final state
            state = slurm_cluster.wait_for(job_id, {"COMPLETED", "FAILED"}, timeout=120)
        fields = slurm_cluster.run("scontrol", "-o", "show", "job", job_id).stdout.split()
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    output = slurm_cluster.output(tmp_path, job_id)
    assert state == "FAILED" and "Restarts=0" in fields, output[-3000:]
    refusals = [line for line in output.splitlines() if line.startswith("hpcddp: error: ")]
    assert len(refusals) == 1 and "within train.stop_before_end_s=120 s" in refusals[0]
    assert "not retried: bad input fails on every node" in output


def test_a_stale_end_time_and_a_relative_time_format_do_not_fool_the_deadline(
    slurm_cluster, tmp_path
):
    stale = int(time.time()) - 3600  # an outer allocation's, long over
    started = time.monotonic()
    job_id, _ = slurm_cluster.sbatch(
        tmp_path,
        "sbatch/train.sh",
        "examples/quickstart.yaml",
        f"run.dir={tmp_path / 'run'}",
        *QUICK,
        "model.factory=tests.fixtures.paced:make_model",  # waits on the clock, not a core
        "train.epochs=1000",
        "train.log_every_steps=1",
        "train.stop_before_end_s=150",  # 3 minutes of time: stop on our own 30 s in
        options=(
            "--time=3",
            "--signal=B:USR2@5",
            f"--export=ALL,SLURM_JOB_END_TIME={stale},SLURM_TIME_FORMAT=relative",
            "--job-name=deadline",
        ),
        wait=False,
    )
    try:
        output_has = lambda text: text in slurm_cluster.output(tmp_path, job_id)  # noqa: E731
        deadline = time.monotonic() + 150
        while not output_has("preempted at step") and time.monotonic() < deadline:
            time.sleep(0.5)
        took = time.monotonic() - started
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    output = slurm_cluster.output(tmp_path, job_id)
    assert "preempted at step" in output, output[-3000:]
    step = int(output.split("preempted at step ")[1].split()[0].rstrip(","))
    assert step > 20  # not at once, as a stale end time would have it
    assert took < 120  # and well before the limit, which a relative time would have hidden
