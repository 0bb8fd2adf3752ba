"""A node that kills its rank is left out of the requeued attempt, and the run completes; the
job is the first link of a chain, which keeps its place.

The run, submitted by ``hpcddp sbatch ... slurm.chain=2``, starts on one node of the two; once
it runs there, the test names that node as bad (`tests.fixtures.bad_node`): its rank kills
itself, srun names the node, the job script requeues the link with that node excluded (as
without a chain), the requeued link resumes on the other node and finishes the run ahead of
the second link, whose Slurm dependency (singleton) holds it back; the second link is then
cancelled before it runs.
"""

import json
import re
import sys
import time

import pytest

from tests.fixtures.helpers import QUICK, REPO, summary, wait_until
from tests.fixtures.resume_proof import prove_resumed, recovered_in_order

pytestmark = pytest.mark.slow


def job_fields(cluster, job_id) -> dict[str, str]:
    out = cluster.run("scontrol", "-o", "show", "job", job_id).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def test_the_failing_node_is_excluded_on_requeue_and_the_run_completes(slurm_cluster, tmp_path):
    run_dir, bad_host = tmp_path / "run", tmp_path / "bad-host"
    submitted = slurm_cluster.run(
        sys.executable, "-m", "hpcddp", "sbatch", str(REPO / "examples/quickstart.yaml"),
        "--nodes", "1", "--tasks-per-node", "2", "--job-name", "badnode",
        f"run.dir={run_dir}", *QUICK, "train.epochs=3", "train.checkpoint_every_steps=4",
        "train.log_every_steps=1", "model.factory=tests.fixtures.bad_node:make_model",
        f"model.kwargs={{host_file: {bad_host}, at_call: 10}}", "slurm.chain=2",
        cwd=tmp_path, extra_env={"PYTHONPATH": str(REPO)},  # the stand-in model lives there
    )  # fmt: skip
    job_id, second_link = submitted.stdout.split()
    try:
        slurm_cluster.wait_for(job_id, {"RUNNING"}, timeout=120)
        (first,) = slurm_cluster.job_hosts(job_id)
        bad_host.write_text(first)  # from now on, a rank there dies at its next step
        died = time.monotonic()
        wait_until(
            lambda: job_fields(slurm_cluster, job_id).get("ExcNodeList") == first,
            f"the job requeued without {first} after its rank died",
            timeout=180,
        )
        requeued = time.monotonic() - died
        assert job_fields(slurm_cluster, job_id)["Restarts"] == "1"
        slurm_cluster.wait_for(job_id, {"PENDING"}, timeout=60)
        assert job_fields(slurm_cluster, second_link)["JobState"] == "PENDING"  # held back
        # Slurm holds a requeued job ~120 s (BeginTime); only someone outside the job can lift it
        slurm_cluster.release(job_id)
        slurm_cluster.wait_for(job_id, {"RUNNING", "COMPLETED"}, timeout=120)
        running = time.monotonic() - died
        final = slurm_cluster.wait_for(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        left = slurm_cluster.wait_for(second_link, {"COMPLETED", "FAILED", "CANCELLED"}, 60)
    finally:
        slurm_cluster.run("scancel", job_id, second_link, check=False)
    output = slurm_cluster.output(tmp_path, job_id)
    assert final == "COMPLETED", output[-4000:]
    print(
        f"rank killed on {first}: job requeued without it {requeued:.1f} s later, running again "
        f"{running:.1f} s after the death (hold lifted by the test)"
    )
    requeued_line = rf"hpcddp: tasks? [0-9-]+ on {first}: Killed; requeueing job {job_id} without"
    assert re.search(rf"{requeued_line} {first} \(failure 1 of at most 2", output)
    done = summary(run_dir)
    assert done["steps"] == 3 * 2048 // 2 // 32 and first not in done["hosts"]
    (failed, finished) = done["attempts"]
    assert (failed["nodes"], failed["excluded"]) == ([first], [first])
    assert re.fullmatch(rf"failed: tasks? [0-9-]+ on {first}: Killed", failed["cause"])
    assert finished["cause"] == "finished" and finished["nodes"] == done["hosts"][:1]
    (resumed_at,) = prove_resumed(run_dir, resumes=1)
    assert resumed_at >= 4  # what its checkpoints kept
    recovered_in_order(run_dir)
    lines = [json.loads(x) for x in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [r["restart"] for r in lines] == [0, 1]
    # the second link never ran: cancelled while it waited, once the first completed the run
    fields = job_fields(slurm_cluster, second_link)
    assert (left, fields["RunTime"]) == ("CANCELLED", "00:00:00"), fields
    assert f"cancelling the chain's links left: {second_link}" in output
