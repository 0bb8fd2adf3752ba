"""`hpcddp env` on the real local cluster: every task resolves its own place, consistently."""

import json
import sys


def test_srun_tasks_resolve_one_consistent_world(slurm_cluster):
    out = slurm_cluster.run(
        "srun", "--nodes=2", "--ntasks-per-node=2", sys.executable, "-m", "hpcddp", "env", "--json"
    ).stdout
    envs = sorted((json.loads(line) for line in out.splitlines()), key=lambda e: e["rank"])
    assert [e["rank"] for e in envs] == [0, 1, 2, 3]
    assert [e["hostname"] for e in envs] == slurm_cluster.ranks_on(2, 2)
    assert [e["local_rank"] for e in envs] == [0, 1, 0, 1]
    assert [e["node_rank"] for e in envs] == [0, 0, 1, 1]
    assert {(e["master_addr"], e["master_port"], e["world_size"], e["launcher"]) for e in envs} == {
        (slurm_cluster.nodes[0], envs[0]["master_port"], 4, "slurm")
    }
    assert 1024 <= envs[0]["master_port"] < 32768


def test_two_steps_of_one_allocation_get_different_ports(slurm_cluster):
    script = f"{sys.executable} -m hpcddp env --json; {sys.executable} -m hpcddp env --json"
    out = slurm_cluster.run(
        "salloc",
        "--nodes=1",
        "--ntasks=1",
        "sh",
        "-c",
        f"srun sh -c '{script.split(';')[0]}'; srun sh -c '{script.split(';')[0]}'",
    ).stdout
    ports = [json.loads(line)["master_port"] for line in out.splitlines() if line.startswith("{")]
    assert len(ports) == 2 and ports[0] != ports[1]


def test_batch_shell_of_many_tasks_is_refused_with_srun_hint(slurm_cluster):
    result = slurm_cluster.run(
        "salloc", "--nodes=1", "--ntasks=2", sys.executable, "-m", "hpcddp", "env", check=False
    )
    assert result.returncode == 2
    assert "no job step" in result.stderr and "srun" in result.stderr
