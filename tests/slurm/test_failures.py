"""Failures on the real cluster end the whole job fast, with a message that names the culprit."""

import subprocess
import time

import psutil
import pytest

from tests.fixtures.helpers import QUICK, line_of, wait_for_step

pytestmark = pytest.mark.slow
LONG = [*QUICK, "train.epochs=200", "train.log_every_steps=1"]


def submit(cluster, tmp_path, *overrides, name="fail", env=None):
    job_id = cluster.run(
        "sbatch",
        "--parsable",
        f"--output={tmp_path}/%x-%j.out",
        f"--job-name={name}",
        "--nodes=2",
        "--ntasks-per-node=2",
        "sbatch/train.sh",
        "examples/quickstart.yaml",
        f"run.dir={tmp_path / 'run'}",
        *LONG,
        *overrides,
        extra_env=env,
    ).stdout.strip()
    return job_id, tmp_path / f"{name}-{job_id}.out"


def rank_process(job_id, rank, timeout=120):
    """The trainer process of ``rank`` in job ``job_id`` (every node shares our PID space)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in psutil.process_iter(["cmdline"]):
            try:
                cmd = " ".join(proc.info["cmdline"] or [])
                if "hpcddp train" not in cmd:
                    continue
                environ = proc.environ()
            except (psutil.Error, OSError):
                continue
            if (
                environ.get("SLURM_JOB_ID") == job_id
                and environ.get("SLURM_PROCID") == str(rank)
                and "SLURM_STEP_ID" in environ
            ):
                return proc
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} of job {job_id} never started")


def cluster_host(cluster, rank):
    """The host of ``rank`` in `submit`'s job (two nodes, two ranks each, in block order)."""
    return cluster.ranks_on(2, 2)[rank]


def ended_within(cluster, job_id, since, limit_s):
    state = cluster.wait_for(
        job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=limit_s + 60
    )
    took = time.monotonic() - since
    assert took < limit_s, f"job {job_id} took {took:.0f} s to end ({state})"
    return state, took


def test_kill_9_of_one_rank_ends_the_job_and_names_it(slurm_cluster, tmp_path):
    job_id, output = submit(slurm_cluster, tmp_path)
    try:
        victim = rank_process(job_id, 3)
        wait_for_step(tmp_path / "run", 3)
        since = time.monotonic()
        victim.kill()
        state, took = ended_within(slurm_cluster, job_id, since, 60)
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    text = output.read_text()
    assert state == "FAILED"
    assert (
        f"{slurm_cluster.nodes[1]}: task 3: Killed" in text
    )  # srun names the host and the rank that died
    print(f"kill -9 of rank 3 ended the job in {took:.1f} s")


def test_exception_in_one_rank_shows_one_traceback_and_stops_all(slurm_cluster, tmp_path):
    job_id, output = submit(
        slurm_cluster,
        tmp_path,
        "model.factory=tests.fixtures.faulty_model:make_model",
        "model.kwargs={rank: 2, at_call: 6, mode: raise}",
    )
    since = time.monotonic()
    try:
        state, _took = ended_within(slurm_cluster, job_id, since, 90)
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    text = output.read_text()
    assert state == "FAILED"
    assert text.count("Traceback (most recent call last)") == 1
    assert "RuntimeError: injected failure on rank 2" in text
    # one line from the failing rank, with the user's frame; the traceback is trimmed to it
    host = cluster_host(slurm_cluster, 2)
    assert (
        f"hpcddp: error: your code in training raised on rank 2 ({host}): RuntimeError: "
        f"injected failure on rank 2 at "
        f"{line_of('tests/fixtures/faulty_model.py', 'raise RuntimeError')} "
        "in forward. HINT: " in text
    )
    frames = [line for line in text.splitlines() if line.lstrip().startswith('File "')]
    assert frames and all("/hpcddp/" not in frame for frame in frames), frames


def test_hung_rank_ends_within_timeout_with_stacks_in_logs(slurm_cluster, tmp_path):
    timeout_s = 20
    job_id, output = submit(slurm_cluster, tmp_path, f"dist.timeout_s={timeout_s}")
    try:
        victim = rank_process(job_id, 3)
        wait_for_step(tmp_path / "run", 3)
        since = time.monotonic()
        victim.suspend()  # kill -STOP: alive, silent
        state, _took = ended_within(slurm_cluster, job_id, since, timeout_s + 30)
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    assert state == "FAILED"
    logs = [(tmp_path / "run" / "logs" / f"rank-{rank}.log").read_text() for rank in (0, 1, 2)]
    # the first survivor whose collective timed out explains it; srun may end the others
    # (rank 0 included) before they print, so the line is in the output or in that rank's log
    assert any(
        "collective that other ranks never reached" in t for t in [output.read_text(), *logs]
    )
    for log in logs:
        assert "most recent call first" in log  # faulthandler's dump of every thread


def test_master_port_in_use_ends_every_rank_and_names_the_port(slurm_cluster, tmp_path):
    holder = subprocess.Popen(
        [
            "nsenter",
            f"--net={slurm_cluster.netns(slurm_cluster.nodes[0])}",
            "python3",
            "-c",
            "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen();"
            "print(s.getsockname()[1], flush=True); time.sleep(300)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = holder.stdout.readline().strip()
        since = time.monotonic()
        job_id, output = submit(slurm_cluster, tmp_path, name="port", env={"MASTER_PORT": port})
        try:
            state, _took = ended_within(slurm_cluster, job_id, since, 60)
        finally:
            slurm_cluster.run("scancel", job_id, check=False)
    finally:
        holder.kill()
    text = output.read_text()
    assert state == "FAILED"
    assert f"MASTER_PORT {port} on {slurm_cluster.nodes[0]} is already in use" in text
    assert "export MASTER_PORT=" in text
