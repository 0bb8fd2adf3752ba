"""`sbatch/train-torchrun.sh`: torchrun per node, c10d rendezvous on the job's first host.

What the script derives is checked against a stub `srun`; on the real local cluster, the same
config at the same world size must train to the same weights whichever launcher numbered the
ranks, so the torchrun job is checked against `sbatch/train.sh` bit for bit.
"""

import json
import os
import subprocess
import sys

import pytest

from hpcddp.ports import derive_port
from tests.helpers import REPO, summary

SCRIPT = REPO / "sbatch" / "train-torchrun.sh"
STUB_SRUN = f"""#!{sys.executable}
import json, os, sys
keep = ("OMP_NUM_THREADS", "SRUN_CPUS_PER_TASK")
print(json.dumps({{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in keep}}}}))
"""


def run_script(tmp_path, *args: str, **slurm: str) -> dict:
    """Run the script as the batch shell would, with a stub srun; return what srun got."""
    srun = tmp_path / "srun"
    srun.write_text(STUB_SRUN)
    srun.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "NPROC_", "OMP_", "HPCDDP_"))}
    env.update(PATH=f"{tmp_path}{os.pathsep}{env['PATH']}", HPCDDP_PYTHON=sys.executable,
               SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="gpu[07-08]", SLURM_NNODES="2", **slurm)
    done = subprocess.run(["bash", str(SCRIPT), *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def torchrun_flags(argv: list[str]) -> dict:
    """torchrun's ``--name=value`` flags from srun's argv."""
    start = argv.index("torch.distributed.run") + 1
    return dict(a[2:].split("=", 1) for a in argv[start:argv.index("-m", start)])


@pytest.mark.parametrize("slurm, nproc, threads", [
    ({"SLURM_CPUS_PER_TASK": "2"}, "2", "1"),  # CPUs only: one process per CPU
    ({"SLURM_CPUS_PER_TASK": "16", "SLURM_GPUS_ON_NODE": "4"}, "4", "4"),
    ({"SLURM_CPUS_PER_TASK": "8", "SLURM_GPUS_PER_NODE": "a100:8"}, "8", "1"),
    ({"SLURM_CPUS_PER_TASK": "8", "NPROC_PER_NODE": "3"}, "3", "2"),
    ({}, "1", "1"),  # no --cpus-per-task at all
])
def test_processes_threads_and_rendezvous_come_from_slurm(tmp_path, slurm, nproc, threads):
    got = run_script(tmp_path, "examples/quickstart.yaml", "train.epochs=1", **slurm)
    argv, flags = got["argv"], torchrun_flags(got["argv"])
    assert argv[:3] == ["--kill-on-bad-exit=1", "--ntasks=2", "--ntasks-per-node=1"]
    assert flags == {"nnodes": "2", "nproc-per-node": nproc, "rdzv-backend": "c10d",
                     "rdzv-endpoint": f"gpu07:{derive_port('4242', 'torchrun')}",
                     "rdzv-id": "4242"}
    assert argv[-5:] == ["-m", "hpcddp", "train", "examples/quickstart.yaml", "train.epochs=1"]
    assert got["env"] == {"OMP_NUM_THREADS": threads,
                          "SRUN_CPUS_PER_TASK": slurm.get("SLURM_CPUS_PER_TASK", "1")}


def test_default_config_and_explicit_rendezvous(tmp_path):
    got = run_script(tmp_path, "optim.lr=0.01", SLURM_CPUS_PER_TASK="2",
                     HPCDDP_RDZV_HOST="head", HPCDDP_RDZV_PORT="29400")
    assert torchrun_flags(got["argv"])["rdzv-endpoint"] == "head:29400"
    assert got["argv"][-3:] == ["train", "examples/quickstart.yaml", "optim.lr=0.01"]

QUICK = ["data.kwargs={train_size: 2048, eval_size: 512}", "data.batch_size=32", "train.epochs=1"]
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def submit(cluster, tmp_path, script: str, run_dir, *options: str) -> str:
    """Submit ``script`` with the quick config into ``run_dir``; return the job id."""
    done = cluster.run("sbatch", "--parsable", f"--output={tmp_path}/%x-%j.out",
                       f"--export=ALL,HPCDDP_PYTHON={sys.executable}", *options, script,
                       "examples/quickstart.yaml", f"run.dir={run_dir}", *QUICK, cwd=REPO)
    return done.stdout.strip().split(";")[0]


def finish(cluster, tmp_path, job_id: str) -> str:
    """Wait for the job; return its output, or fail with it."""
    state = cluster.wait_for(job_id, ENDED, timeout=180)
    log = next(tmp_path.glob(f"*-{job_id}.out"), None)
    output = log.read_text() if log else "(no output file)"
    assert state == "COMPLETED", f"job {job_id} {state}:\n{output[-4000:]}"
    return output


@pytest.mark.slurm
@pytest.mark.slow
def test_torchrun_two_nodes_matches_srun_weights(slurm_cluster, tmp_path):
    # Both jobs fit on the cluster at once (2 CPUs per node each), so they run side by side.
    torchrun_job = submit(slurm_cluster, tmp_path, "sbatch/train-torchrun.sh",
                          tmp_path / "torchrun", "--nodes=2", "--job-name=itest-torchrun")
    srun_job = submit(slurm_cluster, tmp_path, "sbatch/train.sh", tmp_path / "srun",
                      "--nodes=2", "--ntasks-per-node=2", "--job-name=itest-srun")
    output = finish(slurm_cluster, tmp_path, torchrun_job)
    finish(slurm_cluster, tmp_path, srun_job)

    hosts = slurm_cluster.job_hosts(torchrun_job)
    assert len(hosts) == 2
    torchrun, srun = summary(tmp_path / "torchrun"), summary(tmp_path / "srun")
    assert torchrun["world_size"] == 4 and torchrun["launcher"] == "torchrun"
    assert torchrun["job_id"] == torchrun_job
    assert sorted(torchrun["hosts"]) == sorted(hosts * 2)  # two processes on each node
    assert f"2 nodes x 2 processes, rendezvous {hosts[0]}:" in output
    assert srun["world_size"] == 4 and srun["launcher"] == "slurm"
    assert torchrun["steps"] == srun["steps"]
    assert torchrun["weights_sha256"] == srun["weights_sha256"]


def test_requeued_job_appends_and_relies_on_the_trainers_deadline():
    text = SCRIPT.read_text()
    directives = [line.split(None, 1)[1] for line in text.splitlines()
                  if line.startswith("#SBATCH")]
    assert "--open-mode=append" in directives and "--requeue" in directives
    # torchrun does not forward SIGUSR2, so a --signal would only reach the agent
    assert not any(d.startswith("--signal") for d in directives)
    assert "does not forward SIGUSR2" in text and "train.stop_before_end_s" in text
