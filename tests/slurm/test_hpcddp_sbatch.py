"""``hpcddp sbatch`` on the real local cluster: a rendered script runs; the signal path works."""

import pathlib
import sys
import time

import yaml

from hpcddp.config import load_config
from tests.fixtures.helpers import ENDED, HOSTILE, QUICK, REPO, summary, wait_until


def test_submits_a_two_node_job_from_another_directory(slurm_cluster, tmp_path):
    """Outputs land where sbatch ran; a hostile run name reaches the trainer as plain text."""
    run_dir, pwned = tmp_path / "run", tmp_path / "pwned"
    name = HOSTILE.format(pwned=pwned) + "\n#SBATCH --nodes=99 $(touch " + f"{pwned}2)"
    done = slurm_cluster.run(
        sys.executable,
        "-m",
        "hpcddp",
        "sbatch",
        "--nodes",
        "2",
        "--tasks-per-node",
        "2",
        "--job-name",
        "itest-sbatch",
        str(REPO / "examples/quickstart.yaml"),
        f"run.dir={run_dir}",
        *QUICK,
        f"run.name={name}",
        cwd=tmp_path,
        extra_env={"PYTHONPATH": str(REPO)},
    )  # `examples` imports from there
    job_id = done.stdout.strip()
    assert job_id.isdigit(), done.stdout
    state = slurm_cluster.wait_for(job_id, ENDED, timeout=120)
    log = tmp_path / f"itest-sbatch-{job_id}.out"
    assert state == "COMPLETED", log.read_text()[-4000:] if log.exists() else "(no output)"
    result = summary(run_dir)
    hosts = slurm_cluster.job_hosts(job_id)
    assert len(hosts) == 2
    assert result["world_size"] == 4 and result["hosts"] == [h for h in hosts for _ in "ab"]
    assert result["launcher"] == "slurm" and result["job_id"] == job_id
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["name"]
    assert saved == load_config(None, [f"run.name={name}"]).run.name  # as the CLI reads it
    assert not list(tmp_path.glob("pwned*"))
    assert f"hpcddp: job {job_id} on " in log.read_text()


def test_more_nodes_than_the_partition_has_is_one_line(slurm_cluster):
    done = slurm_cluster.run(
        sys.executable,
        "-m",
        "hpcddp",
        "sbatch",
        "--nodes",
        "64",
        "examples/quickstart.yaml",
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("hpcddp: error: sbatch refused the job: ")
    assert "Requested node configuration is not available. HINT: " in done.stderr


# Stands in for Python on the nodes: like a trainer that checkpoints on the signal and cannot
# requeue the job itself, it exits 75 (after a pause, so that under load no task is killed by
# --kill-on-bad-exit before it reports the signal). hpcddp's policy helper, which the job
# script asks what to do before and after the step, runs in the real Python.
FAKE_PYTHON = f"""#!/bin/bash
if [[ $1 == -m && $2 == hpcddp.slurm.policy ]]; then exec {sys.executable} "$@"; fi
trap 'echo "task $SLURM_PROCID on $(hostname) got USR2"; sleep 3; exit 75' USR2
echo "task $SLURM_PROCID started"
while :; do sleep 0.1; done
"""


def wait_for_text(path: pathlib.Path, text: str, count: int = 1, timeout: float = 60) -> str:
    """Poll a job's output until ``text`` appears ``count`` times; return the output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        output = path.read_text() if path.exists() else ""
        if output.count(text) >= count:
            return output
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not {count}x in {path} after {timeout} s:\n{output[-3000:]}")


def test_usr2_to_the_batch_shell_reaches_every_task_and_requeues(slurm_cluster, tmp_path):
    """What --signal=B:USR2 does before the time limit, sent at once with scancel --batch."""
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    done = slurm_cluster.run(
        sys.executable,
        "-m",
        "hpcddp",
        "sbatch",
        "--nodes",
        "2",
        "--tasks-per-node",
        "2",
        "--job-name",
        "itest-usr2",
        "--python",
        str(fake),
        str(REPO / "examples/quickstart.yaml"),
        cwd=tmp_path,
        extra_env={"PYTHONPATH": str(REPO)},
    )
    job_id = done.stdout.strip()
    log = tmp_path / f"itest-usr2-{job_id}.out"
    try:
        wait_for_text(log, "started", count=4)
        hosts = slurm_cluster.job_hosts(job_id)  # a requeued job has no nodes any more
        slurm_cluster.run("scancel", "--signal=USR2", "--batch", job_id)
        output = wait_for_text(log, f"requeueing job {job_id}", timeout=30)
        got = {line for line in output.splitlines() if "got USR2" in line}
        assert got == {f"task {rank} on {hosts[rank // 2]} got USR2" for rank in range(4)}
        # the policy helper says why before the shell runs `scontrol requeue`
        wait_until(
            lambda: (
                "Restarts=1"
                in slurm_cluster.run("scontrol", "-o", "show", "job", job_id).stdout.split()
            ),
            f"job {job_id} requeued",
            timeout=30,
        )
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
