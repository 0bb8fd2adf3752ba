"""Notices and the cost report on the real cluster: a run preempted once tells a webhook
started, preempted, started, completed, in that order; ``hpcddp report`` on that same run adds
up its two attempts.

The receiver listens on the login machine's address on the nodes' bridge
(``slurm_cluster.login_addr``, the ``NET_PREFIX.1`` that ``local-slurm.sh env`` prints as
HPCDDP_SLURM_LOGIN_ADDR): each node is a network namespace of its own, where 127.0.0.1 is the
node itself, not this machine, as on a real cluster.
"""

import json
import time

import pytest

from tests.fixtures.helpers import QUICK, TINY, run_cli, wait_for_step, wait_until
from tests.fixtures.webhook import Receiver
from tests.slurm.test_bad_node import job_fields
from tests.slurm.test_spare_nodes import slurm_time

pytestmark = pytest.mark.slow
LONGER = [*QUICK, "train.epochs=4", "train.log_every_steps=1"]


def test_a_run_preempted_once_is_told_in_order_and_its_cost_adds_up(slurm_cluster, tmp_path):
    """One job for both (the suite deals tests out interleaved: a module fixture would run
    its job once per test)."""
    bodies, run_dir, job_id, clock = preempted_once(slurm_cluster, tmp_path)
    told_in_order(bodies, job_id)
    reported(slurm_cluster, run_dir, job_id, clock)


def preempted_once(slurm_cluster, tmp_path):
    """One 2-node job, preempted (USR2) once at step 5, requeued, finished; what the
    receiver got, the run directory, the job id, and each attempt's bounds by clocks outside
    the run: (its Slurm StartTime, the earliest and latest it may end) in epoch seconds: the
    test's stopwatch when USR2 went and when it saw the requeue, then Slurm's EndTime less
    15 s for the job's exit, and EndTime."""
    run_dir = tmp_path / "run"
    with Receiver(slurm_cluster.login_addr) as receiver:
        job_id = slurm_cluster.run(
            "sbatch", "--parsable", f"--output={tmp_path}/%x-%j.out", "--job-name=notify",
            "--nodes=2", "--ntasks-per-node=1", "sbatch/train.sh", "examples/quickstart.yaml",
            f"run.dir={run_dir}", *LONGER, f"notify.url={receiver.url}",
        ).stdout.strip()  # fmt: skip
        try:
            wait_for_step(run_dir, 5, timeout=180)
            began = slurm_time(job_fields(slurm_cluster, job_id)["StartTime"])
            signalled = time.time()
            slurm_cluster.run("scancel", "--signal=USR2", "--batch", job_id)
            wait_until(
                lambda: "Restarts=1" in slurm_cluster.run("scontrol", "-o", "show", "job",
                                                          job_id).stdout,
                "the requeue", timeout=180,
            )  # fmt: skip
            requeued = time.time()
            slurm_cluster.wait_for(job_id, {"PENDING"}, timeout=60)
            slurm_cluster.release(job_id)  # a requeued job is held ~120 s (BeginTime)
            final = slurm_cluster.wait_for(job_id, {"COMPLETED", "FAILED", "CANCELLED"})
            bodies = receiver.wait_for(4)
        finally:
            slurm_cluster.run("scancel", job_id, check=False)
    output = (tmp_path / f"notify-{job_id}.out").read_text()
    assert final == "COMPLETED", output[-4000:]
    fields = job_fields(slurm_cluster, job_id)  # the last attempt's
    rerun, ended = slurm_time(fields["StartTime"]), slurm_time(fields["EndTime"])
    return bodies, run_dir, job_id, [(began, signalled, requeued), (rerun, ended - 15, ended)]


def told_in_order(bodies, job_id):
    """started, preempted, started, completed: rank 0 alone, once per attempt."""
    assert [(b["event"], b["job"]) for b in bodies] == [
        ("started", job_id),
        ("preempted", job_id),
        ("started", job_id),  # once per attempt: the requeued job started again
        ("completed", job_id),
    ]
    started, preempted, resumed, completed = bodies
    assert started["step"] == 0 and preempted["step"] >= 5
    assert resumed["step"] == preempted["step"]  # it resumed where it was preempted
    assert completed["step"] == 4 * 2048 // (32 * 2)
    assert "resumed from step" in resumed["text"] and "2 ranks on 2 node(s)" in resumed["text"]


def reported(slurm_cluster, run_dir, job_id, clock):
    """``hpcddp report`` on that run: node-hours are nodes x wall over its two attempts, and
    each attempt's wall lies where clocks outside the run put it (``clock``)."""
    done = run_cli("report", str(run_dir), "--json", env=slurm_cluster.cli_env)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    first, second = got["runs"][0]["attempts"]
    assert (first["cause"], second["cause"]) == ("preempted", "finished")
    assert (first["job"], first["nodes"], second["nodes"]) == (job_id, 2, 2)
    assert first["steps_gained"] + second["steps_gained"] == 128
    node_hours = sum(a["nodes"] * a["wall_s"] for a in (first, second)) / 3600
    assert got["totals"]["node_hours"] == pytest.approx(node_hours, rel=0.01)
    for attempt, (began, end_after, end_before) in zip((first, second), clock, strict=True):
        # Slurm's clock is whole seconds, and a process start is known to a second; the
        # attempt ends after the stop was asked (or shortly before the job's end: its exit)
        # and before the requeue was seen (or the job's end)
        assert began - 1 <= attempt["started"] <= began + 30, (began, attempt)
        assert end_after <= attempt["ended"] <= end_before + 1, (clock, attempt)
        assert attempt["wall_s"] == pytest.approx(attempt["ended"] - attempt["started"])
    assert second["waited_s"] > 0 and second["lost_s"] > second["waited_s"]
    # every attempt's rank 0 wrote its start, not only the attempts after a failure
    assert len((run_dir / "starts.jsonl").read_text().splitlines()) == 2
    # this cluster keeps no accounting: the report says so and uses the run's records
    assert got["accounting"] == "sacct: Slurm accounting storage is disabled"
    table = run_cli("report", str(run_dir), env=slurm_cluster.cli_env)
    assert table.returncode == 0 and "Slurm accounting: sacct" in table.stdout
    print(table.stdout)


def test_a_dead_rank_is_told_once_by_the_batch_shell(slurm_cluster, tmp_path):
    """Rank 1 dies; under hpcddp's job script rank 0 leaves the failure to the batch shell,
    which tells it once it knows that no retry follows (slurm.max_failures=0)."""
    with Receiver(slurm_cluster.login_addr) as receiver:
        done = slurm_cluster.run(
            "sbatch", "--parsable", "--wait", f"--output={tmp_path}/%x-%j.out",
            "--job-name=notify-dies", "--nodes=1", "--ntasks-per-node=2", "sbatch/train.sh",
            "examples/quickstart.yaml", f"run.dir={tmp_path / 'run'}", *TINY,
            "model.factory=tests.fixtures.faulty_model:make_model",
            "model.kwargs={rank: 1, at_call: 2, mode: raise}",  # in a step, after "started"
            "slurm.max_failures=0", f"notify.url={receiver.url}", timeout=300, check=False,
        )  # fmt: skip
        job_id = done.stdout.strip().split(";")[0]
        bodies = receiver.wait_for(2)
        time.sleep(0.5)  # a duplicate would have arrived by now
    assert done.returncode != 0
    assert [(b["event"], b["job"]) for b in receiver.bodies] == [
        ("started", job_id),
        ("failed", job_id),
    ]
    assert "not retried: slurm.max_failures=0" in bodies[1]["text"], bodies[1]["text"]
