"""A rank that hangs outside any collective is found by the watchdog, named, ended as a rank
death, and its node left out of the requeued attempt, which completes the run; sharded
(``dist.strategy=fsdp``), as the watchdog knows nothing of the strategy.

The run starts on one node of the two, two ranks there; once it runs, the test names that node
(`tests.fixtures.hang_node`): rank 1 sleeps forever in its forward while rank 0 waits for it in
FSDP's all-gather of the first block's parameters. With ``dist.hang_timeout_s=20`` both
watchdogs see the stall, write their stacks, and agree through the store that rank 1 is behind;
rank 1 ends with the HUNG status, the job script requeues the job without the node, and the
next attempt finishes from the sharded checkpoint.
"""

import json
import re
import time

import pytest

from hpcddp import exit_codes
from hpcddp.records import attempts
from tests.fixtures.helpers import QUICK, SHARDED, summary, wait_until
from tests.fixtures.resume_proof import prove_resumed, recovered_in_order
from tests.fixtures.webhook import Receiver
from tests.slurm.test_bad_node import job_fields

pytestmark = pytest.mark.slow


def test_a_hung_rank_is_named_with_its_stacks_and_the_job_goes_on_without_its_node(
    slurm_cluster, tmp_path
):
    run_dir, hang_host = tmp_path / "run", tmp_path / "hang-host"
    with Receiver(slurm_cluster.login_addr) as receiver:
        job_id, _ = slurm_cluster.sbatch(
            tmp_path,
            "sbatch/train.sh",
            "examples/quickstart.yaml",
            f"run.dir={run_dir}",
            *QUICK,
            "train.epochs=3",
            "train.checkpoint_every_steps=4",
            "train.log_every_steps=1",
            "dist.hang_timeout_s=20",
            *SHARDED,
            "model.factory=tests.fixtures.hang_node:make_model",
            f"model.kwargs={{host_file: {hang_host}, at_call: 10, rank: 1}}",
            f"notify.url={receiver.url}",
            options=("--nodes=1", "--ntasks-per-node=2", "--job-name=hang"),
            wait=False,
        )
        try:
            slurm_cluster.wait_for(job_id, {"RUNNING"}, timeout=120)
            (first,) = slurm_cluster.job_hosts(job_id)
            hang_host.write_text(first)  # from now on, rank 1 there hangs at its next step
            wait_until(
                lambda: job_fields(slurm_cluster, job_id).get("ExcNodeList") == first,
                f"the job requeued without {first} after its rank hung",
                timeout=240,
            )
            slurm_cluster.wait_for(job_id, {"PENDING"}, timeout=60)
            slurm_cluster.release(job_id)  # Slurm's ~120 s requeue hold: see test_bad_node
            final = slurm_cluster.wait_for(
                job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=400
            )
            receiver.wait_for(5)
            time.sleep(0.5)  # a duplicate would have arrived by now
        finally:
            slurm_cluster.run("scancel", job_id, check=False)
    output = slurm_cluster.output(tmp_path, job_id)
    assert final == "COMPLETED", output[-4000:]

    stacks = attempts.hang_dir(run_dir, job_id, 0)
    console = re.findall(rf"hang: rank 1 on {first} after step \d+ \(at \S+ in \w+\).*", output)
    assert len(console) == 1, output[-4000:]  # one line, from the hung rank
    assert "hang_node.py" in console[0] and f"stacks are in {stacks}" in console[0]
    # every rank's stacks, the hung frame in the hung rank's, the all-reduce wait in the other's
    assert "sleep_forever" in (stacks / "rank-1.txt").read_text()
    assert "foreach_all_gather" in (stacks / "rank-0.txt").read_text()  # fsdp's gather
    assert re.search(
        rf"hpcddp: rank 1 on {first}: hung; requeueing job {job_id} without {first} ", output
    )
    assert f"Exited with exit code {exit_codes.HUNG}" in output  # a rank death, not bad input

    done = summary(run_dir)
    assert {c.suffix for c in (run_dir / "checkpoints").iterdir()} == {".dcp"}  # sharded
    assert done["steps"] == 3 * 2048 // 2 // 32 and first not in done["hosts"]
    (resumed_at,) = prove_resumed(run_dir, resumes=1)
    failed, finished = done["attempts"]
    assert failed["cause"] == f"failed: rank 1 on {first}: hung" and failed["excluded"] == [first]
    assert finished["cause"] == "finished"
    recovery = recovered_in_order(run_dir)
    # told: started, the hang and the requeue (the batch shell), the requeued start, the end
    assert [(b["event"], b["job"], b["step"]) for b in receiver.bodies] == [
        ("started", job_id, 0),
        ("hang", job_id, resumed_at),
        ("requeued", job_id, resumed_at),
        ("started", job_id, resumed_at),
        ("completed", job_id, done["steps"]),
    ]
    assert f"rank 1 on {first}" in receiver.bodies[1]["text"]
    assert f"without {first}" in receiver.bodies[2]["text"]
    verdict = json.loads((stacks / "verdict.json").read_text())
    hung_report = next(r for r in verdict["reports"] if r["rank"] == 1)
    hung_at = recovery.detected - hung_report["stalled_s"]
    print(
        f"hang at {time.strftime('%H:%M:%S', time.localtime(hung_at))}: detected "
        f"+{recovery.detected - hung_at:.1f} s, ranks gone +{recovery.gone - hung_at:.1f} s, "
        f"requeued attempt started +{recovery.started - hung_at:.1f} s (Slurm's hold lifted "
        f"by the test), checkpoint loaded +{recovery.loaded - hung_at:.1f} s, first step "
        f"+{recovery.first_step - hung_at:.1f} s"
    )
    print(f"hpcddp status: last recovery: {recovery.as_line()}")
