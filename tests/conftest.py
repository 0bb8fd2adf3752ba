"""Fixtures: the real local multi-node Slurm cluster the integration tests run on.

The suite starts the cluster itself (tests/cluster/local-slurm.sh). Under ``CI=true`` a cluster
that cannot start fails the tests instead of skipping them: a skipped integration test proves
nothing.
"""

import dataclasses
import os
import pathlib
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO / "tests" / "cluster" / "local-slurm.sh"


@dataclasses.dataclass
class SlurmCluster:
    """A running cluster: its config file and the environment its clients need."""

    conf: str
    env: dict

    def run(self, *args: str, timeout: float = 120, check: bool = True,
            cwd: pathlib.Path = REPO, extra_env: dict | None = None) -> subprocess.CompletedProcess:
        """Run a Slurm client (sbatch, srun, squeue, ...) against this cluster."""
        result = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                                cwd=cwd, env={**self.env, **(extra_env or {})})
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        return result

    def job_state(self, job_id: str) -> str:
        """The job's state from scontrol (no accounting needed)."""
        out = self.run("scontrol", "show", "job", job_id, check=False).stdout
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "UNKNOWN"

    def job_hosts(self, job_id: str) -> list[str]:
        """The job's hosts in node order, as Slurm itself expands its node list."""
        out = self.run("scontrol", "-o", "show", "job", job_id).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return self.run("scontrol", "show", "hostnames", fields["NodeList"]).stdout.split()

    def wait_for(self, job_id: str, states: set[str], timeout: float = 300) -> str:
        """Poll until the job reaches one of ``states``; return the state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} still {self.job_state(job_id)} after {timeout} s")


def _cluster_unavailable(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"local Slurm cluster could not start under CI: {message}")
    pytest.skip(f"local Slurm cluster unavailable: {message}")


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """Start (or reuse) the local multi-node cluster for the whole session."""
    if os.geteuid() != 0:
        _cluster_unavailable("the local cluster needs root (network namespaces, apt)")
    started = subprocess.run(["bash", str(CLUSTER_SCRIPT), "start"], capture_output=True,
                             text=True, timeout=900)
    if started.returncode != 0:
        _cluster_unavailable(f"{CLUSTER_SCRIPT} start failed:\n{started.stdout[-3000:]}"
                             f"\n{started.stderr[-3000:]}")
    printed = subprocess.run(["bash", str(CLUSTER_SCRIPT), "env"], capture_output=True,
                             text=True, check=True).stdout
    conf = next(line.split("=", 1)[1].strip().strip("'\"") for line in printed.splitlines()
                if "SLURM_CONF=" in line)
    return SlurmCluster(conf=conf, env={**os.environ, "SLURM_CONF": conf})
