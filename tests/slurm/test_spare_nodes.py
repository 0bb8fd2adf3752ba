"""Spare nodes: a node dies and training goes on inside the same job, on a spare, exactly.

``sbatch -N3 sbatch/train.sh CONFIG slurm.spare_nodes=1`` trains on the first two nodes and
keeps the third in reserve. Every rank on the second node dies at its 40th step
(`tests.fixtures.dying_node`); the batch shell asks `hpcddp.slurm.policy`, which answers
``run FIRST,THIRD SECOND``, and starts a new step there at once: no requeue (Restarts=0), no
queue wait; the ranks resume from the latest checkpoint with the same world size, so the final
weights equal an uninterrupted run's. Both runs are sharded (``dist.strategy=fsdp``): the ranks
on the spare read the shards the dead node's ranks wrote.
"""

import json
import re
import time

import pytest

from tests.fixtures.helpers import QUICK, SHARDED, run_cli, summary
from tests.fixtures.resume_proof import prove_resumed, recovered_in_order
from tests.fixtures.webhook import Receiver

pytestmark = pytest.mark.slow
STEPS = 4 * 2048 // (4 * 32)  # four epochs at world size 4
RUN = [
    *QUICK,
    "train.epochs=4",
    "train.checkpoint_every_steps=4",
    "train.log_every_steps=1",
    "model.factory=tests.fixtures.dying_node:make_model",
    *SHARDED,
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
    with Receiver(slurm_cluster.login_addr) as receiver:
        job_id, output = slurm_cluster.sbatch(
            tmp_path,
            "-N3",
            "sbatch/train.sh",
            "examples/quickstart.yaml",
            f"run.dir={run_dir}",
            *RUN,
            f"model.kwargs={{node_index: 1, at_call: 40, record_dir: {records}}}",
            "slurm.spare_nodes=1",
            f"notify.url={receiver.url}",
            options=("--ntasks-per-node=2", "--job-name=spare"),
        )
        bodies = receiver.wait_for(4)
        time.sleep(0.5)  # a duplicate would have arrived by now
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
    # What the job script and the policy add: the new step's start, less what starting the
    # job's first step took on this same machine under the same load (srun, its own start-up
    # and the shell's, before the ranks' imports): a requeue would add Slurm's hold (~120 s).
    first_start = first_launch(slurm_cluster, job_id, run_dir)
    print(f"the job's first step's processes started {first_start:.1f} s after the job did")
    assert launched - death <= first_start + 10, output[-4000:]
    restart = rf"hpcddp: tasks? [0-9,-]+ on {second}: Killed; restarting in job {job_id} on "
    assert re.search(rf"{restart}{first},{third} without {second} \(failure 1 of at most 2", output)

    done, expected = summary(run_dir), summary(straight)
    assert done["steps"] == expected["steps"] == STEPS
    assert done["weights_sha256"] == expected["weights_sha256"]
    (resumed_at,) = prove_resumed(run_dir, resumes=1)
    assert {c.suffix for c in (run_dir / "checkpoints").iterdir()} == {".dcp"}  # sharded
    failed, finished = done["attempts"]
    assert failed["nodes"] == [first, second] and failed["excluded"] == [second]
    assert failed["then"] == "restart" and 36 <= resumed_at < 40  # checkpoints every 4 steps
    assert finished["cause"] == "finished" and sorted(finished["nodes"]) == [first, third]
    lines = [json.loads(x) for x in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [r["restart"] for r in lines] == [0, 0]  # Slurm's count: never requeued
    recovered_in_order(run_dir)

    # told: started, the batch shell's restart, the new step's start, its end; nothing twice
    assert [(b["event"], b["job"], b["step"]) for b in receiver.bodies] == [
        ("started", job_id, 0),
        ("restarted", job_id, resumed_at),
        ("started", job_id, resumed_at),
        ("completed", job_id, STEPS),
    ], bodies
    assert f"on {first},{third} without {second}" in receiver.bodies[1]["text"]
    paid_for(slurm_cluster, run_dir, job_id)


def first_launch(cluster, job_id: str, run_dir) -> float:
    """Seconds from the job's start (Slurm's StartTime) to its first attempt's rank 0 process."""
    begun = slurm_time(job_fields(cluster, job_id)["StartTime"])
    started = json.loads((run_dir / "starts.jsonl").read_text().splitlines()[0])["started"]
    return started - begun


def slurm_time(text: str) -> float:
    """Slurm's ``2026-11-27T12:00:00`` (this machine's local time) as epoch seconds."""
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def paid_for(cluster, run_dir, job_id: str) -> None:
    """``hpcddp report``: both attempts held all three nodes, the spare included, and their
    times agree with Slurm's own clock for the job (never requeued: one StartTime and EndTime
    span both attempts)."""
    done = run_cli("report", str(run_dir), "--json", env=cluster.cli_env)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    attempts = got["runs"][0]["attempts"]
    assert [(a["job"], a["nodes"]) for a in attempts] == [(job_id, 3), (job_id, 3)]
    fields = job_fields(cluster, job_id)
    begun, ended = slurm_time(fields["StartTime"]), slurm_time(fields["EndTime"])
    one, two = attempts
    # inside the job's run by Slurm's clock (whole seconds; a process start is known to a
    # second), one after the other, and the run's end shortly before the job's
    assert begun - 1 <= one["started"] < one["ended"] <= two["started"] + 1, (begun, attempts)
    assert two["started"] < two["ended"] <= ended + 1 and ended - two["ended"] < 15, (ended, two)
    walls = [a["ended"] - a["started"] for a in attempts]
    assert got["totals"]["node_hours"] == pytest.approx(3 * sum(walls) / 3600, rel=1e-3)
