"""`hpcddp.submit` / `sweep` from the "login node" (this process) onto the real local cluster,
and `hpcddp status` / `logs` on a cluster without accounting (no sacct)."""

import dataclasses
import json
import pathlib
import time

import pytest
from submitit.core.utils import FailedJobError, UncompletedJobError

import hpcddp
from hpcddp.outcome import StopReason
from hpcddp.run_files import read_summary
from hpcddp.slurm import submission
from tests.fixtures.helpers import QUICK, REPO, run_cli, summary, wait_until
from tests.fixtures.resume_proof import prove_resumed, resumed_in_metrics

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(slurm_cluster, monkeypatch, tmp_path):
    """Submit in-process: Slurm clients need SLURM_CONF in this process's own environment."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)
    monkeypatch.setenv("HPCDDP_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.chdir(REPO)
    jobs = {"HPCDDP_JOBS_DIR": str(tmp_path / "jobs")}
    return dataclasses.replace(slurm_cluster, cli_env={**slurm_cluster.cli_env, **jobs})


# A run that lasts until the test has acted on it, sleeping rather than burning the cores
PACED = [
    "model.factory=tests.fixtures.paced:make_model",
    "model.kwargs={sleep_s: 0.05}",
    "data.kwargs={train_size: 2048, eval_size: 64}",
]
CHECKPOINTS = {"ddp": "step-*.pt", "fsdp": "step-*.dcp"}  # whole, or each rank's shards
STATUS_KEYS = ("job", "state", "nodes", "run dir", "summary.json", "output")


def fields(text: str) -> dict[str, str]:
    """`hpcddp status` output -> {key: value}."""
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def test_submit_two_nodes_from_the_login_node(cluster, tmp_path):
    run_dir = tmp_path / "run"
    job = hpcddp.submit(
        "examples/quickstart.yaml", [f"run.dir={run_dir}", *QUICK], nodes=2, tasks_per_node=2
    )
    assert isinstance(job, submission.SlurmRun) and job.num_tasks == 4
    done = job.result().summary  # blocks only here, not in submit()
    assert done.world_size == 4 and done.launcher == "slurm"
    assert done.hosts == cluster.ranks_on(2, 2) and done.job_id == job.job_id
    assert done == read_summary(run_dir)
    script = (run_dir / "submitit" / f"{job.job_id}_submission.sh").read_text()
    assert "#SBATCH --requeue" in script and "--kill-on-bad-exit=1" in script

    cluster.wait_for(job.job_id, {"COMPLETED"}, timeout=60)
    status = run_cli("status", job.job_id, env=cluster.cli_env, timeout=60)
    assert status.returncode == 0, status.stderr
    shown = fields(status.stdout)
    assert shown["step"].startswith("16 (epoch") and shown["finished"] == "yes"  # the run's figures
    assert shown["held by"] == "nobody (not running now)"
    assert {k: v for k, v in shown.items() if k in STATUS_KEYS} == {
        "job": job.job_id,
        "state": "COMPLETED",
        "nodes": cluster.run(
            "scontrol", "show", "hostlist", ",".join(cluster.nodes[:2])
        ).stdout.strip(),
        "run dir": str(run_dir),
        "summary.json": "yes",
        "output": str(run_dir / "submitit" / f"{job.job_id}_0_log.out"),
    }

    rank3 = run_cli("logs", job.job_id, "--rank", "3", env=cluster.cli_env, timeout=60)
    assert rank3.returncode == 0, rank3.stderr
    assert rank3.stdout == (run_dir / "logs" / "rank-3.log").read_text()
    assert f"[rank 3/4 {cluster.nodes[1]}]" in rank3.stdout
    output = run_cli("logs", job.job_id, env=cluster.cli_env, timeout=60)
    assert "Job completed successfully" in output.stdout  # submitit's line in task 0's stdout
    assert "finished: 16 steps" in output.stdout  # rank 0's log line, from task 0's stderr


def test_sweep_is_one_array_with_limited_parallelism(cluster, tmp_path):
    base = tmp_path / "sweep"
    runs = hpcddp.sweep(
        "examples/quickstart.yaml",
        {"optim.lr": [0.001, 0.003]},
        [f"run.dir={base}", *QUICK],
        max_parallel=1,
        nodes=1,
        tasks_per_node=2,
    )
    array_id = runs[0].job_id.split("_")[0]
    assert [job.job_id for job in runs] == [f"{array_id}_0", f"{array_id}_1"]
    script = (base / "submitit" / f"{array_id}_submission.sh").read_text()
    assert "#SBATCH --array=0-1%1" in script  # at most one task at a time

    results = [job.result().summary for job in runs]
    dirs = sorted(p.name for p in base.iterdir() if p.is_dir() and p.name != "submitit")
    assert (base / "sweep.json").is_file()  # the sweep directory knows itself
    assert dirs == ["0-optim.lr=0.001", "1-optim.lr=0.003"]
    for name, result in zip(dirs, results, strict=True):
        assert read_summary(base / name) == result and result.world_size == 2
    assert results[0].weights_sha256 != results[1].weights_sha256

    status = run_cli("status", array_id, env=cluster.cli_env, timeout=60)
    blocks = [fields(block) for block in status.stdout.strip().split("\n\n")]
    assert [(b["job"], b["run dir"]) for b in blocks] == [
        (f"{array_id}_0", str(base / dirs[0])),
        (f"{array_id}_1", str(base / dirs[1])),
    ]
    assert {b["summary.json"] for b in blocks} == {"yes"}


def test_cli_submit_prints_the_id_and_does_not_wait(cluster, tmp_path):
    run_dir = tmp_path / "run"
    submitted = run_cli(
        "submit",
        "examples/quickstart.yaml",
        "--nodes",
        "1",
        "--tasks-per-node",
        "1",
        "--time",
        "5",
        f"run.dir={run_dir}",
        *QUICK,
        "train.max_steps=3",
        env=cluster.cli_env,
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id.isdigit() and f"hpcddp status {job_id}" in submitted.stderr
    record = json.loads((tmp_path / "jobs" / f"{job_id}.json").read_text())
    assert record["run_dir"] == str(run_dir) and record["num_tasks"] == 1
    cluster.wait_for(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
    status = fields(run_cli("status", job_id, env=cluster.cli_env, timeout=60).stdout)
    assert (status["state"], status["summary.json"]) == ("COMPLETED", "yes")
    assert summary(run_dir)["steps"] == 3


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_rank_death_in_a_submitted_chains_link_ends_its_result_and_the_next_link_resumes(
    cluster, tmp_path, strategy
):
    """A chain through `hpcddp.submit` (what ``hpcddp submit ... slurm.chain=2`` calls): rank 1
    of the first link dies hard at step 10 (SIGKILL: no result file, and no accounting here),
    so job.result() must still end (submitit#1720); no job script tells the failure under
    submitit, and the next link tries again: it resumes from the step-8 checkpoint and
    completes the run. Under fsdp the save is waited for: every rank's shards of step 8, still
    being written in the background at step 10, would leave a torn checkpoint that resume
    rightly skips (tests/local/test_fsdp.py tests that)."""
    run_dir = tmp_path / "run"
    job = hpcddp.submit(
        "examples/quickstart.yaml",
        [
            f"run.dir={run_dir}", *QUICK, "train.checkpoint_every_steps=4",
            "train.log_every_steps=1", "slurm.chain=2", f"dist.strategy={strategy}",
            f"train.checkpoint_async={str(strategy == 'ddp').lower()}",
            "model.factory=tests.fixtures.dies_in_first_job:make_model",
            f"model.kwargs={{rank: 1, at_call: 10, marker_dir: {tmp_path}}}",
        ],
        nodes=1,
        tasks_per_node=2,
    )  # fmt: skip
    links = json.loads((run_dir / "chain.json").read_text())["links"]
    try:
        assert len(links) == 2 and links[0] == job.job_id, links
        started = time.monotonic()
        # Rank 0 raises (gloo: "Connection closed by peer"), or is killed by --kill-on-bad-exit.
        with pytest.raises((FailedJobError, UncompletedJobError)):
            job.result()
        assert time.monotonic() - started < 90
        assert (tmp_path / "died").exists()  # the death happened, in the first link
        assert not (run_dir / "submitit" / f"{job.job_id}_1_result.pkl").exists()
        assert cluster.wait_for(links[0], {"FAILED", "COMPLETED", "CANCELLED"}, 60) == "FAILED"
        assert cluster.wait_for(links[1], {"FAILED", "COMPLETED", "CANCELLED"}, 180) == "COMPLETED"
    finally:
        cluster.run("scancel", *links, check=False)
    status = fields(run_cli("status", job.job_id, env=cluster.cli_env, timeout=60).stdout)
    assert status["state"] == "FAILED"  # the first link's (the run's summary.json is the next's)
    done = summary(run_dir)
    assert done["steps"] == 2048 // 2 // 32 and done["job_id"] == links[1]
    resumed_in_metrics(run_dir, [8])  # where the first link's checkpoint left it
    (finished,) = done["attempts"]  # the dead link left no record: no job script under submitit
    assert (finished["job"], finished["cause"], finished["steps_gained"]) == (
        links[1],
        "finished",
        24,
    )
    chain = run_cli("status", str(run_dir), env=cluster.cli_env, timeout=60).stdout
    assert "link 1:" in chain and "link 2:" in chain and "completed the run" in chain, chain
    written = (run_dir / "checkpoints").glob(CHECKPOINTS[strategy])
    assert any(written), sorted((run_dir / "checkpoints").iterdir())


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_preempted_job_requeues_and_result_waits_for_the_rerun(cluster, tmp_path, strategy):
    run_dir = tmp_path / "run"
    job = hpcddp.submit(
        "examples/quickstart.yaml",
        [f"run.dir={run_dir}", *PACED, "train.epochs=8", f"dist.strategy={strategy}"],
        nodes=1,
        tasks_per_node=2,
    )
    try:
        wait_until((run_dir / "metrics.jsonl").exists, "the run to start", timeout=90)
        cluster.run("scancel", "--signal=USR2", job.job_id)  # what --signal=USR2@N sends
        cluster.wait_for(job.job_id, {"PENDING"}, timeout=60)  # requeued, held ~120 s
        cluster.release(job.job_id)
        done = job.result().summary
    finally:
        cluster.run("scancel", job.job_id, check=False)
    assert done.steps == 8 * 2048 // 2 // 64 and done.world_size == 2
    assert "Restarts=1" in cluster.run("scontrol", "show", "job", job.job_id).stdout
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "requeued" in log and "resumed from step" in log
    (resumed_at,) = prove_resumed(run_dir, resumes=1, log_every_steps=25)  # where it stopped
    assert f"preempted at step {resumed_at}, checkpoint saved" in log
    written = (run_dir / "checkpoints").glob(CHECKPOINTS[strategy])
    assert any(written), sorted((run_dir / "checkpoints").iterdir())


def test_scancel_stops_a_running_job_for_good(cluster, tmp_path):
    """SIGTERM from scancel stops the run with a checkpoint and no self-requeue, also when it
    lands during start-up: Slurm then already reports the job's end as now, which must read as
    a stop, never as a job given too little time (bad input)."""
    run_dir, gate = tmp_path / "run", tmp_path / "gate"
    job = hpcddp.submit(
        "examples/quickstart.yaml",
        [f"run.dir={run_dir}", "train.epochs=20", "data.kwargs={train_size: 2048, eval_size: 64}",
         "model.factory=tests.fixtures.gated_setup:make_model", f"model.kwargs={{gate: {gate}}}"],
        nodes=1,
        tasks_per_node=1,
    )  # fmt: skip
    try:
        # the run is starting (its first forward): stop signals are caught, the job's end is
        # not read yet
        wait_until(pathlib.Path(f"{gate}.building").exists, "the run to start", timeout=90)
        cluster.run("scancel", job.job_id)
        wait_until(lambda: _ending(cluster, job.job_id), "Slurm to mark the job ending", 30)
        pathlib.Path(f"{gate}.go").touch()  # now the run reads the job's end: now
        stopped = job.result()
        settled = cluster.wait_settled(job.job_id)  # its last process gone: no requeue after
        record = cluster.run("scontrol", "show", "job", job.job_id).stdout
    finally:
        cluster.run("scancel", job.job_id, check=False)  # a requeued, pending job: no signal
    assert stopped.stop == StopReason.TERMINATED and not stopped.requeued
    assert settled == "CANCELLED" and "Restarts=0" in record, record
    status = fields(run_cli("status", job.job_id, env=cluster.cli_env, timeout=60).stdout)
    assert (status["state"], status["summary.json"]) == ("CANCELLED", "no")


def _ending(cluster, job_id: str) -> bool:
    """Slurm no longer reports the job as running (cancelled: its end is now)."""
    state = cluster.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()
    return state != "RUNNING"


def test_a_failing_job_is_failed_everywhere(cluster, tmp_path):
    run_dir = tmp_path / "run"
    job = hpcddp.submit(
        "examples/quickstart.yaml",
        [f"run.dir={run_dir}", *QUICK, "model.factory=examples.quickstart:nope"],
        nodes=1,
        tasks_per_node=2,
    )
    with pytest.raises(Exception, match="nope"):
        job.result()
    cluster.wait_for(job.job_id, {"FAILED", "COMPLETED"}, timeout=60)
    status = fields(run_cli("status", job.job_id, env=cluster.cli_env, timeout=60).stdout)
    assert status["state"] == "FAILED"


def test_unknown_job_id_is_a_usage_error(cluster):
    result = run_cli("status", "999999", env=cluster.cli_env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("hpcddp: error: no job 999999")
    assert len(result.stderr.strip().splitlines()) == 1
