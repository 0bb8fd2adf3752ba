"""A chain on the real cluster: a run with more work than its one-minute time limit holds goes
on across links with no user action, never requeues, ends with the weights of an unchained
run, and the links left over are cancelled before they run. Both runs are sharded
(``dist.strategy=fsdp``): each link resumes from the shards the last one wrote at its stop.
Its trackers (TensorBoard, W&B offline, MLflow's file store) hold one run across the links,
each step once, finished. The same chain typed as ``hpcddp submit ... slurm.chain=5``
(submitit) runs beside it: its links run one after another, each resuming where the last one
stopped, to the same weights."""

import datetime
import itertools
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.fixtures.helpers import ENDED, QUICK, REPO, SHARDED, run_cli, summary
from tests.fixtures.resume_proof import prove_resumed
from tests.fixtures.tracker_reads import mlflow_holds, tensorboard_holds, wandb_holds

pytestmark = pytest.mark.slow
# 64 steps of at least 0.8 s (a sleep in rank 0's forward: no CPU taken from the other tests):
# over 51 s of training alone, more than a 1-minute job holds before its 15 s stop margin.
WORK = [
    *QUICK,
    "train.epochs=2",
    "model.factory=tests.fixtures.slow_rank:make_model",
    "model.kwargs={rank: 0, delay_s: 0.8}",
    "slurm.signal_delay_s=0",
    "train.stop_before_end_s=15",
    *SHARDED,
]
# Links enough that some are left to cancel even on a loaded machine (2 or 3 usually run; one
# left pending costs nothing).
LINKS, SUBMIT_LINKS = 6, 5


def test_a_chain_finishes_past_the_time_limit_and_cancels_the_links_left(slurm_cluster, tmp_path):
    straight, chained = tmp_path / "straight", tmp_path / "chained"
    by_submit = tmp_path / "submitted"
    through_submitit = _submit_chain(slurm_cluster, tmp_path, by_submit)  # the others meanwhile
    # the unchained run, its rank 0 not held back (the delay changes no weight): done in
    # seconds, it leaves the cluster's CPUs to the two chains' links
    reference, _ = slurm_cluster.sbatch(
        tmp_path,
        "sbatch/train.sh",
        "examples/quickstart.yaml",
        f"run.dir={straight}",
        *WORK,
        "model.kwargs={delay_s: 0}",
        options=("--time=10", "--ntasks-per-node=2", "--job-name=unchained"),
        wait=False,
    )
    submitted = slurm_cluster.run(
        sys.executable,
        "-m",
        "hpcddp",
        "sbatch",
        str(REPO / "examples/quickstart.yaml"),
        f"run.dir={chained}",
        *WORK,
        "slurm.time_min=1",
        f"slurm.chain={LINKS}",
        "tracking.backends=[tensorboard,wandb,mlflow]",
        "tracking.project=chained",
        cwd=tmp_path,
        extra_env={
            "PYTHONPATH": str(REPO),  # the stand-in model and `examples` live there
            **{"WANDB_SILENT": "true", "WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": ""},
        },
    )
    links = submitted.stdout.split()
    printed, errors = through_submitit.communicate(timeout=120)
    record = by_submit / "chain.json"  # written before its first link is submitted
    submit_links = json.loads(record.read_text())["links"] if record.exists() else []
    try:
        assert through_submitit.returncode == 0, errors[-3000:]
        assert len(links) == LINKS and all(link.isdigit() for link in links), submitted.stdout
        states = [slurm_cluster.wait_for(link, ENDED, timeout=300) for link in links]
        submit_states = [slurm_cluster.wait_for(link, ENDED, timeout=300) for link in submit_links]
        assert slurm_cluster.wait_for(reference, ENDED, timeout=120) == "COMPLETED"
    finally:
        slurm_cluster.run("scancel", reference, *links, *submit_links, check=False)
    outputs = "\n".join(slurm_cluster.output(tmp_path, link) for link in links)
    ran = states.index("CANCELLED") if "CANCELLED" in states else len(links)
    assert ran >= 2 and states[:ran] == ["COMPLETED"] * ran, f"{states}\n{outputs[-4000:]}"

    # Every link ran once (no requeue); each resumed where the last one stopped.
    for link in links[:ran]:
        assert "Restarts=0" in slurm_cluster.run("scontrol", "-o", "show", "job", link).stdout
    records = [json.loads(line) for line in (chained / "attempts.jsonl").read_text().splitlines()]
    assert [r["job"] for r in records] == links[:ran], records
    assert [r["cause"] for r in records] == ["preempted"] * (ran - 1) + ["finished"]
    assert all(a["step"] == b["from_step"] for a, b in itertools.pairwise(records))

    # Bitwise the weights of the unchained run.
    assert summary(chained)["weights_sha256"] == summary(straight)["weights_sha256"]
    assert summary(chained)["steps"] == summary(straight)["steps"] == 64
    assert {c.suffix for c in (chained / "checkpoints").iterdir()} == {".dcp"}  # sharded

    # The links left were cancelled while pending: no node, no output, no run time.
    for link in links[ran:]:
        fields = slurm_cluster.run("scontrol", "-o", "show", "job", link).stdout
        assert "JobState=CANCELLED" in fields and "RunTime=00:00:00" in fields, fields
        assert not list(tmp_path.glob(f"*-{link}.out"))
    assert f"cancelling the chain's links left: {','.join(links[ran:])}" in outputs

    # the trackers: one run across the links, each link but the last handed on (stopped)
    tensorboard_holds(chained)
    wandb_holds(chained, attempts=ran)
    mlflow_holds(chained, "chained")

    status = run_cli("status", str(chained), env=slurm_cluster.cli_env).stdout
    assert f"link 1:           job {links[0]}" in status and "handed on at its time" in status
    assert f"link {ran}:" in status and "completed the run" in status, status
    assert f"link {ran + 1}:" in status and "CANCELLED" in status, status

    # `hpcddp submit`: the first link's id printed, the links one after another (singleton),
    # each resuming where the last one stopped (a hand-on at its time limit), no requeue
    assert printed.split() == submit_links[:1], printed
    name = json.loads(record.read_text())["name"]
    assert f"chain {name}: jobs {','.join(submit_links)}" in errors, errors
    assert f"scancel --name={name}" in errors, errors
    went = submit_states.index("CANCELLED") if "CANCELLED" in submit_states else SUBMIT_LINKS
    assert went >= 2 and submit_states[:went] == ["COMPLETED"] * went, submit_states
    assert submit_states[went:] == ["CANCELLED"] * (SUBMIT_LINKS - went), submit_states
    shown = [_job(slurm_cluster, link) for link in submit_links[:went]]
    assert [job["Restarts"] for job in shown] == ["0"] * went, shown
    spans = [
        [datetime.datetime.fromisoformat(j[k]) for k in ("StartTime", "EndTime")] for j in shown
    ]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    prove_resumed(by_submit, resumes=went - 1, log_every_steps=25)
    records = [json.loads(line) for line in (by_submit / "attempts.jsonl").read_text().splitlines()]
    assert [(r["job"], r["cause"]) for r in records] == [
        *((link, "preempted") for link in submit_links[: went - 1]),
        (submit_links[went - 1], "finished"),
    ], records
    assert summary(by_submit)["weights_sha256"] == summary(straight)["weights_sha256"]
    status = run_cli("status", str(by_submit), env=slurm_cluster.cli_env).stdout
    assert f"link 1:           job {submit_links[0]}" in status, status
    assert "handed on at its time" in status and "completed the run" in status, status


def _submit_chain(slurm_cluster, tmp_path: pathlib.Path, run_dir: pathlib.Path):
    """``hpcddp submit`` as a user types it for the same run as a chain, started."""
    command = ["submit", "examples/quickstart.yaml", f"run.dir={run_dir}", *WORK]
    command += ["slurm.time_min=1", f"slurm.chain={SUBMIT_LINKS}"]
    command += ["train.checkpoint_every_steps=8"]  # older checkpoints too: a link takes the newest
    return subprocess.Popen(
        [sys.executable, "-m", "hpcddp", *command],
        cwd=REPO,
        env={
            **os.environ,
            **slurm_cluster.cli_env,
            "HPCDDP_JOBS_DIR": str(tmp_path / "jobs"),
            "PYTHONPATH": str(REPO),  # the stand-in model and `examples` live there
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _job(slurm_cluster, job: str) -> dict[str, str]:
    """What ``scontrol show job`` says of the job, field by field."""
    shown = slurm_cluster.run("scontrol", "-o", "show", "job", job).stdout.split()
    return dict(item.split("=", 1) for item in shown if "=" in item)
