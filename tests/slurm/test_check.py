"""`hpcddp check` on the real cluster, whose nodes have real nodes' traps: each node's own name
is 127.0.1.1, its cluster interface is named unlike its neighbour's, and a decoy ib0 comes first.
A node whose link is rate-limited, or whose CPU is throttled, is named."""

import sys

import pytest

import hpcddp
from tests.fixtures.helpers import REPO

pytestmark = pytest.mark.slow


def srun_check(cluster, tmp_path, *extra, nodes=2, per_node=2, check=True, env=None):
    return cluster.run(
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={nodes}",
        f"--ntasks-per-node={per_node}",
        sys.executable,
        "-m",
        "hpcddp",
        "check",
        "examples/quickstart.yaml",
        f"run.dir={tmp_path / 'run'}",
        *extra,
        timeout=300,
        check=check,
        extra_env=env,
    )


def table_rows(stdout: str) -> list[list[str]]:
    """The per-rank rows: from the header line to the first blank line."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("rank "))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def test_the_table_shows_each_rank_on_the_interface_that_routes_to_the_master(
    slurm_cluster, tmp_path
):
    done = srun_check(slurm_cluster, tmp_path)
    print(done.stdout)  # the table, for the record
    rows = table_rows(done.stdout)
    hosts = slurm_cluster.ranks_on(2, 2)
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (str(rank), hosts[rank], f"{rank % 2}/2") for rank in range(4)
    ]
    # cpus, gpus, then "interface address": never the decoy ib0, never loopback
    chosen = {(r[1], r[5], r[6]) for r in rows}
    subnet = slurm_cluster.login_addr.rsplit(".", 1)[0] + "."
    assert {(h, slurm_cluster.ifnames[h]) for h, _, _ in chosen} == {(h, i) for h, i, _ in chosen}
    assert all(address.startswith(subnet) for _, _, address in chosen)
    assert len({name for _, name, _ in chosen}) == 2  # eth0 on one node, ens4 on the other
    assert "all-reduce (gloo, 4 ranks)" in done.stdout and "node pairs" in done.stdout
    # Debian's 127.0.1.1 line is found, and is only a warning: hpcddp copes with it
    assert "resolve their own names to 127.0.1.1" in done.stdout
    assert done.stdout.splitlines()[-1].endswith("warning(s): the job would train.")


@pytest.mark.quiet
def test_a_throttled_node_and_a_rate_limited_node_are_both_named(slurm_cluster, tmp_path):
    """One check, two slow nodes: one at 15 % of a core, the other sending at 40 Mbit/s. Each
    is named for what is slow about it, and neither is broken: the job would train."""
    throttled, limited = slurm_cluster.nodes[0], slurm_cluster.nodes[1]
    with (
        slurm_cluster.shaped(throttled, "cpu=15"),
        slurm_cluster.shaped(limited, "link=40mbit"),
    ):
        # one rank a node: the throttled node's quota is not shared, so it starts in half the time
        done = srun_check(slurm_cluster, tmp_path, "--size-mb", "4", per_node=1)
    lines = done.stdout.splitlines()
    print("\n".join(line for line in lines if "Gb/s" in line or line.startswith("compute")))
    assert f"warning: slow node {throttled}: the same computation takes" in done.stdout, done.stdout
    named = [line for line in lines if line.startswith(f"warning: slow node {limited}")]
    assert named and f"{limited}'s outgoing link" in named[0], done.stdout
    assert done.returncode == 0  # slow is not broken: the job would train, slowly


def test_a_job_that_would_not_train_exits_non_zero_with_one_line(slurm_cluster, tmp_path):
    asked = "slurm.gpus_per_node=2"
    done = srun_check(slurm_cluster, tmp_path, asked, nodes=2, per_node=1, check=False)
    assert done.returncode == 1
    (error,) = [line for line in done.stdout.splitlines() if line.startswith("error: ")]
    nodes = slurm_cluster.run("scontrol", "show", "hostlist", ",".join(slurm_cluster.nodes[:2]))
    assert error.startswith(f"error: {nodes.stdout.strip()}: {asked} but its ranks see no GPU")
    assert done.stderr.count("hpcddp: error: hpcddp check found 1 error(s)") == 1  # rank 0 only


def test_check_through_sbatch_and_submit(slurm_cluster, tmp_path, monkeypatch):
    """The same resources and launch as training: the job script with --check, and submit()."""
    _job_id, output = slurm_cluster.sbatch(
        tmp_path,
        "sbatch/train.sh",
        "--check",
        "examples/quickstart.yaml",
        f"run.dir={tmp_path / 'run'}",
        options=("--nodes=2", "--ntasks-per-node=1"),
    )
    assert "hpcddp check: 2 rank(s) on 2 node(s), launcher slurm" in output
    assert "the job would train." in output and "Traceback" not in output
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)  # submit from this process
    monkeypatch.setenv("HPCDDP_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "submitted"
    job = hpcddp.submit(
        "examples/quickstart.yaml", [f"run.dir={run_dir}"], check=True, nodes=2, tasks_per_node=1
    )
    result = job.result()
    assert result["errors"] == 0 and len(result["report"]["ranks"]) == 2
    assert (
        "hpcddp check: 2 rank(s) on 2 node(s)"
        in (run_dir / "submitit" / f"{job.job_id}_0_log.out").read_text()
    )
