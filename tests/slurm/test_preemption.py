"""Preemption on the real cluster: a 2-node job stopped twice by USR2, requeued, resumed, exact;
its TensorBoard run is one run that holds each step once, as an uninterrupted run's does."""

import pytest

from tests.fixtures.helpers import (
    ENDED,
    QUICK,
    logged_step,
    summary,
    wait_for_step,
    wait_until,
)

pytestmark = pytest.mark.slow
LONGER = [*QUICK, "train.epochs=6", "train.log_every_steps=1", "tracking.backends=[tensorboard]"]
SAME_IN_EVERY_RUN = ("loss", "lr", "eval_loss", "eval_accuracy")  # not the timings
STEPS = 6 * 2048 // (4 * 32)  # six epochs at world size 4


def test_preempted_twice_then_identical_weights(slurm_cluster, tmp_path):
    options = ("--nodes=2", "--ntasks-per-node=2")
    (tmp_path / "ref").mkdir()
    # the uninterrupted run trains while the other waits on its stops and requeues
    reference, _ = slurm_cluster.sbatch(
        tmp_path / "ref",
        "sbatch/train.sh",
        "examples/quickstart.yaml",
        f"run.dir={tmp_path / 'straight'}",
        *LONGER,
        options=options,
        wait=False,
    )
    run_dir = tmp_path / "preempted"
    job_id = slurm_cluster.run(
        "sbatch",
        "--parsable",
        f"--output={tmp_path}/%x-%j.out",
        "--job-name=preempt",
        *options,
        "sbatch/train.sh",
        "examples/quickstart.yaml",
        f"run.dir={run_dir}",
        *LONGER,
    ).stdout.strip()
    try:
        at_step = 10
        for restart in (1, 2):
            wait_for_step(run_dir, at_step, timeout=180)
            # what --signal=B:USR2@... does before the time limit: USR2 to the batch shell only
            slurm_cluster.run("scancel", "--signal=USR2", "--batch", job_id)
            wait_until(
                lambda restart=restart: (
                    f"Restarts={restart}"
                    in slurm_cluster.run("scontrol", "-o", "show", "job", job_id).stdout
                ),
                f"requeue {restart}",
                timeout=180,
            )
            slurm_cluster.wait_for(job_id, {"PENDING"}, timeout=60)
            # a requeued job is held ~120 s (BeginTime); release it now
            slurm_cluster.release(job_id)
            # the next stop half-way through what is left: in the next attempt, however far this
            # one ran before its stop took effect (a fixed step 40 was once passed before it)
            stopped = logged_step(run_dir)
            at_step = stopped + (STEPS - stopped) // 2
            assert at_step > stopped, f"attempt {restart} ran to step {stopped} before it stopped"
        final = slurm_cluster.wait_for(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        output = (tmp_path / f"preempt-{job_id}.out").read_text()
        assert final == "COMPLETED", output[-4000:]
        straight_end = slurm_cluster.wait_for(reference, ENDED, timeout=300)
        assert straight_end == "COMPLETED", slurm_cluster.output(tmp_path / "ref", reference)
    finally:
        slurm_cluster.run("scancel", job_id, reference, check=False)
    expected = summary(tmp_path / "straight")
    assert output.count("requeued") >= 2 and "restart 2" in output
    got = summary(run_dir)
    assert got["weights_sha256"] == expected["weights_sha256"]
    assert got["steps"] == expected["steps"] == STEPS
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*.pt"))
    assert checkpoints  # the stops left complete checkpoints behind, then the final one

    # TensorBoard's own reader: three attempts' event files are one run, every step once.
    straight, preempted = scalars(tmp_path / "straight"), scalars(run_dir)
    assert len(list((run_dir / "tracking" / "tensorboard").glob("events.out.tfevents.*"))) == 3
    assert [step for step, _ in preempted["loss"]] == list(range(1, expected["steps"] + 1))
    assert preempted == straight


def scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """(step, value) per tag, as TensorBoard shows them (purged points gone)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tracking" / "tensorboard"))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)]
        for tag in SAME_IN_EVERY_RUN
        if tag in events.Tags()["scalars"]
    }
