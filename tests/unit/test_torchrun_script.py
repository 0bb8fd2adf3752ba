"""`sbatch/train-torchrun.sh` against a stub `srun`: ranks per node, threads and rendezvous.

tests/slurm/test_torchrun.py runs it for real and checks it against `sbatch/train.sh` bit for bit.
"""

import json
import os
import subprocess
import sys

import pytest

from hpcddp.launch.ports import derive_port
from tests.fixtures.helpers import REPO

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
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "NPROC_", "OMP_", "HPCDDP_"))
    }
    env.update(
        PATH=f"{tmp_path}{os.pathsep}{env['PATH']}",
        HPCDDP_PYTHON=sys.executable,
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="gpu[07-08]",
        SLURM_NNODES="2",
        **slurm,
    )
    done = subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def torchrun_flags(argv: list[str]) -> dict:
    """torchrun's ``--name=value`` flags from srun's argv."""
    start = argv.index("torch.distributed.run") + 1
    return dict(a[2:].split("=", 1) for a in argv[start : argv.index("-m", start)])


@pytest.mark.parametrize(
    "slurm, nproc, threads",
    [
        ({"SLURM_CPUS_PER_TASK": "2"}, "2", "1"),  # CPUs only: one process per CPU
        ({"SLURM_CPUS_PER_TASK": "16", "SLURM_GPUS_ON_NODE": "4"}, "4", "4"),
        ({"SLURM_CPUS_PER_TASK": "8", "SLURM_GPUS_PER_NODE": "a100:8"}, "8", "1"),
        ({"SLURM_CPUS_PER_TASK": "8", "NPROC_PER_NODE": "3"}, "3", "2"),
        ({}, "1", "1"),  # no --cpus-per-task at all
    ],
)
def test_processes_threads_and_rendezvous_come_from_slurm(tmp_path, slurm, nproc, threads):
    got = run_script(tmp_path, "examples/quickstart.yaml", "train.epochs=1", **slurm)
    argv, flags = got["argv"], torchrun_flags(got["argv"])
    assert argv[:3] == ["--kill-on-bad-exit=1", "--ntasks=2", "--ntasks-per-node=1"]
    assert flags == {
        "nnodes": "2",
        "nproc-per-node": nproc,
        "rdzv-backend": "c10d",
        "rdzv-endpoint": f"gpu07:{derive_port('4242', 'torchrun')}",
        "rdzv-id": "4242",
    }
    assert argv[-5:] == [
        "-m",
        "hpcddp",
        "train",
        "--config=examples/quickstart.yaml",
        "train.epochs=1",
    ]
    assert got["env"] == {
        "OMP_NUM_THREADS": threads,
        "SRUN_CPUS_PER_TASK": slurm.get("SLURM_CPUS_PER_TASK", "1"),
    }


def test_default_config_and_explicit_rendezvous(tmp_path):
    got = run_script(
        tmp_path,
        "optim.lr=0.01",
        SLURM_CPUS_PER_TASK="2",
        HPCDDP_RDZV_HOST="head",
        HPCDDP_RDZV_PORT="29400",
    )
    assert torchrun_flags(got["argv"])["rdzv-endpoint"] == "head:29400"
    assert got["argv"][-3:] == ["train", "--config=examples/quickstart.yaml", "optim.lr=0.01"]


def test_requeued_job_appends_and_relies_on_the_trainers_deadline():
    text = SCRIPT.read_text()
    directives = [
        line.split(None, 1)[1] for line in text.splitlines() if line.startswith("#SBATCH")
    ]
    assert "--open-mode=append" in directives and "--requeue" in directives
    # torchrun does not forward SIGUSR2, so a --signal would only reach the agent
    assert not any(d.startswith("--signal") for d in directives)
    assert "does not forward SIGUSR2" in text and "train.stop_before_end_s" in text
