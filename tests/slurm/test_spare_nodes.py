"""Spare nodes: a node dies and training goes on inside the same job, on a spare, exactly.

``sbatch -N3 sbatch/train.sh CONFIG slurm.spare_nodes=1`` trains on the first two nodes and
keeps the third in reserve. Every rank on the second node dies at its 40th step
(`tests.fixtures.dying_node`); the batch shell asks `hpcddp.slurm.policy`, which answers
``run FIRST,THIRD SECOND``, and starts a new step there at once: no requeue (Restarts=0), no
queue wait; the ranks resume from the latest checkpoint with the same world size, so the final
weights equal an uninterrupted run's.
"""

import json
import re

import pytest

from tests.fixtures.helpers import QUICK, summary

pytestmark = pytest.mark.slow
STEPS = 4 * 2048 // (4 * 32)  # four epochs at world size 4
RUN = [
    *QUICK,
    "train.epochs=4",
    "train.checkpoint_every_steps=4",
    "train.log_every_steps=1",
    "model.factory=tests.fixtures.dying_node:make_model",
]


def job_fields(cluster, job_id) -> dict[str, str]:
    out = cluster.run("scontrol", "-o", "show", "job", job_id).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def recorded(folder, what: str) -> list[tuple[float, float]]:
    """(when, process start) of each rank's note (`tests.fixtures.dying_node`), earliest first."""
    notes = (p.read_text().split() for p in folder.glob(f"{what}-*"))
    return sorted((float(when), float(started)) for when, started in notes)


def test_a_dead_node_is_replaced_by_a_spare_within_the_job(spare_cluster, tmp_path):
    slurm_cluster = spare_cluster  # 3 nodes: 2 train, 1 in reserve
    (tmp_path / "ref").mkdir()
    straight = tmp_path / "straight"
    slurm_cluster.sbatch(
        tmp_path / "ref",
        "sbatch/train.sh",
        "examples/quickstart.yaml",
        f"run.dir={straight}",
        *RUN,
        f"model.kwargs={{node_index: -1, at_call: 40, record_dir: {tmp_path}}}",
        options=("--nodes=2", "--ntasks-per-node=2"),
    )
    records, run_dir = tmp_path / "records", tmp_path / "spare"
    records.mkdir()
    job_id, output = slurm_cluster.sbatch(
        tmp_path,
        "-N3",
        "sbatch/train.sh",
        "examples/quickstart.yaml",
        f"run.dir={run_dir}",
        *RUN,
        f"model.kwargs={{node_index: 1, at_call: 40, record_dir: {records}}}",
        "slurm.spare_nodes=1",
        options=("--ntasks-per-node=2", "--job-name=spare"),
    )
    first, second, third = slurm_cluster.nodes[:3]
    fields = job_fields(slurm_cluster, job_id)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0"), output[-4000:]
    died, back = recorded(records, "died"), recorded(records, "back")
    assert len(died) >= 1 and len(back) == 4, output[-4000:]  # a new step of four ranks
    death, launched, first_step = died[0][0], min(s for _, s in back), back[0][0]
    print(
        f"rank death on {second} -> new step's processes started {launched - death:.1f} s later "
        f"(teardown, decision, srun), first step {first_step - death:.1f} s after the death "
        f"({first_step - launched:.1f} s of it the ranks' start-up and resume)"
    )
    # What the job script and the policy do: the ranks' own start-up (imports, setup) is the
    # start-up's, measured above; timings on a loaded 2-core machine are noisy.
    assert launched - death <= 10, output[-4000:]
    restart = rf"hpcddp: tasks? [0-9,-]+ on {second}: Killed; restarting in job {job_id} on "
    assert re.search(rf"{restart}{first},{third} without {second} \(failure 1 of at most 2", output)

    done, expected = summary(run_dir), summary(straight)
    assert done["steps"] == expected["steps"] == STEPS
    assert done["weights_sha256"] == expected["weights_sha256"]
    failed, finished = done["attempts"]
    assert failed["nodes"] == [first, second] and failed["excluded"] == [second]
    assert failed["then"] == "restart" and failed["steps_gained"] >= 36  # checkpoints to 40
    assert finished["cause"] == "finished" and sorted(finished["nodes"]) == [first, third]
    lines = [json.loads(x) for x in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [r["restart"] for r in lines] == [0, 0]  # Slurm's count: never requeued
