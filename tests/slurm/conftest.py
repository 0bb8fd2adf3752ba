"""The Slurm tier: every test here runs on the real local multi-node cluster.

The suite starts the cluster itself (tests/cluster/local-slurm.sh), installing Slurm with apt
when it is missing. Under ``CI=true`` a cluster that cannot start fails the tests instead of
skipping them: a skipped integration test proves nothing. ``HPCDDP_SLURM_INSTANCE=k`` runs the
tests on a cluster of their own (nodes c<k>n1, c<k>n2), beside any other.
"""

import contextlib
import dataclasses
import os
import pathlib
import shlex
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.fixtures import cluster_boot
from tests.fixtures.cluster_boot import CLUSTER_SCRIPT
from tests.fixtures.helpers import ENDED, REPO, in_ci


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything in this folder is a Slurm test (``-m "not slurm"`` leaves the tier out)."""
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(item.fspath).parents:
            item.add_marker(pytest.mark.slurm)


@dataclasses.dataclass
class SlurmCluster:
    """A running cluster: its config file, its nodes and the environment its clients need."""

    conf: str
    env: dict[str, str]
    nodes: list[str]
    login_addr: str  # this machine's address on the nodes' network, as a site's file server
    netns_prefix: str  # node N's network namespace is /run/netns/<netns_prefix>N
    # what a user's shell on the login node adds to the environment: at least SLURM_CONF
    cli_env: dict[str, str] = dataclasses.field(default_factory=dict)
    # each node's cluster interface (names differ between nodes; each also has a decoy ib0)
    ifnames: dict[str, str] = dataclasses.field(default_factory=dict)

    @contextlib.contextmanager
    def shaped(self, node: str, what: str) -> Iterator[None]:
        """Make ``node`` slow for the block (``link=40mbit``, ``cpu=20``), and always undo it."""
        self._shape(node, what)
        try:
            yield
        finally:
            self._shape(node, "off")

    def _shape(self, node: str, what: str) -> None:
        done = subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), "shape", node, what],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
        )
        assert done.returncode == 0, done.stderr

    def netns(self, node: str) -> str:
        """The network namespace of ``node``, for ``nsenter --net=...``."""
        return f"/run/netns/{self.netns_prefix}{node}"

    def ranks_on(self, nodes: int, per_node: int) -> list[str]:
        """The host of each rank of a block-distributed step on the first ``nodes`` nodes."""
        return [host for host in self.nodes[:nodes] for _ in range(per_node)]

    def run(
        self,
        *args: str,
        timeout: float = 120,
        check: bool = True,
        cwd: pathlib.Path = REPO,
        extra_env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client (sbatch, srun, squeue, ...) against this cluster."""
        result = subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env={**self.env, **(extra_env or {})},
            input=input,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
            )
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

    def release(self, job_id: str) -> None:
        """Lift the ~120 s hold (BeginTime) Slurm puts on a requeued, pending job.

        Not to ``now``: a start within the second of the requeue is killed by Slurm
        ("Killing non-startable batch job: Job credential revoked", measured on 22.05).
        """
        self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now+2")

    def wait_for(self, job_id: str, states: set[str], timeout: float = 300) -> str:
        """Poll until the job reaches one of ``states``; return the state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} still {self.job_state(job_id)} after {timeout} s")

    def wait_settled(self, job_id: str, timeout: float = 120) -> str:
        """Wait until none of the job's processes is left; return squeue's state then.

        A job cancelled while it runs stays COMPLETING until its last process has ended, so once
        it leaves that state nothing of the job is left that could still requeue it.
        """
        settled = {*ENDED, "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            command = ("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T")
            state = self.run(*command, check=False).stdout.strip()
            if state in settled:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} still {state or 'unknown'} after {timeout} s")

    def sbatch(
        self, tmp_path: pathlib.Path, *args: str, options: tuple[str, ...] = (), wait: bool = True
    ) -> tuple[str, str]:
        """Submit ``sbatch OPTIONS ARGS`` with output in ``tmp_path``; (job id, its output so far).

        With ``wait`` (the default) it returns once the job has ended and fails unless it ended
        well; without, it returns at once with no output.
        """
        result = self.run(
            "sbatch",
            "--parsable",
            *(["--wait"] if wait else []),
            f"--output={tmp_path}/%x-%j.out",
            *options,
            *args,
            timeout=600,
            check=False,
        )
        job_id = result.stdout.strip().split(";")[0]
        if not wait:
            assert result.returncode == 0, result.stderr
            return job_id, ""
        output = self.output(tmp_path, job_id)
        assert result.returncode == 0, f"job {job_id} failed:\n{output[-4000:]}\n{result.stderr}"
        return job_id, output

    @staticmethod
    def output(tmp_path: pathlib.Path, job_id: str) -> str:
        """The job's output file in ``tmp_path`` (as `sbatch` above names it)."""
        log = next(tmp_path.glob(f"*-{job_id}.out"), None)
        return log.read_text() if log else "(no output file)"


def _cluster_unavailable(message: str) -> None:
    if in_ci():
        pytest.fail(f"local Slurm cluster could not start under CI: {message}")
    pytest.skip(f"local Slurm cluster unavailable: {message}")


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """Start (or reuse) the local multi-node cluster for the whole session."""
    return _cluster(cluster_boot.MAIN_INSTANCE, nodes=None)


@pytest.fixture(scope="session")
def spare_cluster() -> SlurmCluster:
    """A 3-node cluster of its own (instance 8, or HPCDDP_SLURM_SPARE_INSTANCE), for the tests
    that keep a node in reserve; the 2-node cluster's tests are left undisturbed by a third
    node."""
    return _cluster(cluster_boot.SPARE_INSTANCE, nodes=cluster_boot.SPARE_NODES)


def _cluster(instance: str, nodes: int | None) -> SlurmCluster:
    """Start (or reuse) local cluster ``instance`` ("" for the default), with ``nodes`` nodes
    (None: the script's default or HPCDDP_SLURM_NODES)."""
    if os.geteuid() != 0:
        _cluster_unavailable("the local cluster needs root (network namespaces, apt)")
    started = cluster_boot.start(instance, nodes)  # quick if the suite's boot started it
    if started.returncode != 0:
        _cluster_unavailable(
            f"{CLUSTER_SCRIPT} start failed:\n{started.stdout[-3000:]}\n{started.stderr[-3000:]}"
        )
    printed = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "env"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HPCDDP_SLURM_INSTANCE": instance},
    ).stdout
    exported = dict(
        line.removeprefix("export ").split("=", 1) for line in printed.splitlines() if "=" in line
    )
    exported = {name: shlex.split(value)[0] if value else "" for name, value in exported.items()}
    conf = exported["SLURM_CONF"]
    env = {**os.environ, "SLURM_CONF": conf}
    hosts = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    return SlurmCluster(
        conf=conf,
        env=env,
        nodes=sorted(set(hosts), key=_node_number),
        login_addr=exported["HPCDDP_SLURM_LOGIN_ADDR"],
        netns_prefix=exported["HPCDDP_SLURM_NETNS_PREFIX"],
        cli_env={"SLURM_CONF": conf},
        ifnames=dict(pair.split("=") for pair in exported["HPCDDP_SLURM_IFNAMES"].split()),
    )


@pytest.fixture(scope="session", autouse=True)
def _prompt_job_watcher() -> Iterator[None]:
    """submitit's job watcher asks squeue at most every 2 s here, not every 30 s.

    A job that ends without a result (cancelled, failed before it wrote one) is only noticed
    when the watcher next asks Slurm; tests wait for that, users can afford 30 s.
    """
    from hpcddp.slurm import submission

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(submission.SlurmRun, "watcher", submission._SqueueWatcher(delay_s=2))
        yield


def _node_number(name: str) -> int:
    digits = name[len(name.rstrip("0123456789")) :]
    return int(digits or 0)
