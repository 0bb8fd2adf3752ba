"""No spare left: a node dies and training goes on inside the same job on the node that remains.

``sbatch -N2 --ntasks-per-node=1 sbatch/train.sh CONFIG dist.strategy=fsdp
slurm.shrink_on_failure=true slurm.min_nodes=1`` trains one rank on each node, sharded (the
MLP's Linear layers are its blocks). The rank on the second node dies at its 20th step
(`tests.fixtures.dying_node`); with no spare to take its place the batch shell asks
`hpcddp.slurm.policy`, which answers ``run FIRST SECOND``: a new step of one rank on the first
node, at once, in the same job (no requeue, no queue wait). That rank resumes from the latest
checkpoint, each of the two ranks' shards resharded onto one, and keeps the global batch of 64
samples by accumulating two micro-batches of 32 (`hpcddp.train.resharding`), so the run ends at
the same step count. (ddp's resume at another world size is tests/local/test_trainer.py's.)
"""

import re
import time

import pytest

from tests.fixtures.helpers import QUICK, SHARDED, summary
from tests.fixtures.resume_proof import prove_resumed
from tests.fixtures.webhook import Receiver

pytestmark = pytest.mark.slow
STEPS = 2 * 2048 // (2 * 32)  # two epochs at a global batch of 64


def test_a_dead_node_with_no_spare_shrinks_the_run_onto_the_node_left(slurm_cluster, tmp_path):
    records, run_dir = tmp_path / "records", tmp_path / "run"
    records.mkdir()
    with Receiver(slurm_cluster.login_addr) as receiver:
        job_id, output = slurm_cluster.sbatch(
            tmp_path,
            "-N2",
            "sbatch/train.sh",
            "examples/quickstart.yaml",
            f"run.dir={run_dir}",
            *QUICK,
            "train.epochs=2",
            "train.checkpoint_every_steps=4",
            "train.log_every_steps=1",
            "model.factory=tests.fixtures.dying_node:make_model",
            f"model.kwargs={{node_index: 1, at_call: 20, record_dir: {records}}}",
            "slurm.nodes=2",
            "slurm.shrink_on_failure=true",
            "slurm.min_nodes=1",
            *SHARDED,
            f"notify.url={receiver.url}",
            options=("--ntasks-per-node=1", "--job-name=shrink"),
        )
        receiver.wait_for(4)
        time.sleep(0.5)  # a duplicate would have arrived by now
    first, second = slurm_cluster.nodes[:2]
    fields = slurm_cluster.run("scontrol", "-o", "show", "job", job_id).stdout
    assert "JobState=COMPLETED" in fields and "Restarts=0" in fields, output[-4000:]
    shrank = (
        rf"hpcddp: task 1 on {second}: Killed; no spare left, shrinking from 2 to 1 node\(s\) "
        rf"\(slurm.min_nodes=1\): restarting in job {job_id} on {first} without {second} "
    )
    assert re.search(shrank, output), output[-4000:]
    assert "train.grad_accum_steps 1 -> 2 keeps the global batch of 64 samples" in output
    # sharded on both nodes, then on the one left, from every rank's shards
    assert "fsdp: 3 blocks sharded over 2 ranks" in output
    assert "fsdp: 3 blocks sharded over 1 ranks" in output
    assert "resuming a checkpoint of 2 ranks on 1" in output

    done = summary(run_dir)
    checkpoints = list((run_dir / "checkpoints").iterdir())
    assert checkpoints and all(c.name.endswith(".dcp") for c in checkpoints), checkpoints
    assert done["steps"] == STEPS  # each step still 64 samples: as many steps as planned
    assert done["final_loss"] < 1.0  # it trained: an untrained model's loss is ln 4 = 1.39
    (resumed_at,) = prove_resumed(run_dir, resumes=1)
    # the newest checkpoint complete before the death (every 4 steps; the one of step 16 may
    # still be in flight when the rank dies at step 20), never an older one
    before_death = output[: re.search(shrank, output).start()]
    saved = re.findall(r"saved sharded checkpoint \S*step-(\d+)\.dcp", before_death)
    assert resumed_at == max(map(int, saved)) >= 12, saved
    failed, finished = done["attempts"]
    assert (failed["nodes"], failed["then"]) == ([first, second], "restart")
    assert failed["shrank"] == {"from_nodes": 2, "to_nodes": 1}
    assert finished["cause"] == "finished" and finished["nodes"] == [first]

    # told: started, the batch shell's restart saying it shrank, the smaller step's start, end
    assert [(b["event"], b["step"]) for b in receiver.bodies] == [
        ("started", 0),
        ("restarted", resumed_at),
        ("started", resumed_at),
        ("completed", STEPS),
    ], receiver.bodies
    assert "shrinking from 2 to 1 node(s)" in receiver.bodies[1]["text"]
