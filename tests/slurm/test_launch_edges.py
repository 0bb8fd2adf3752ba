"""The launch environments users end up with, on the real cluster: each gets one line at once,
or the right answer. (Every one is also a unit test on a plain environment dict.)"""

import json
import sys
import time

import pytest

from tests.fixtures.helpers import QUICKSTART, TINY

PY = sys.executable


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hpcddp: error: ")]


def srun_train(
    cluster, tmp_path, *, prefix=(), env=None, options=("--nodes=2", "--ntasks-per-node=2")
):
    """Interactive ``srun`` without --kill-on-bad-exit: a rank that gives up alone would leave
    the others waiting, so only a refusal that reaches every rank ends quickly."""
    since = time.monotonic()
    done = cluster.run(
        "srun",
        *options,
        *prefix,
        PY,
        "-m",
        "hpcddp",
        "train",
        QUICKSTART,
        f"run.dir={tmp_path / 'run'}",
        *TINY,
        timeout=300,
        check=False,
        extra_env=env,
    )
    return done, time.monotonic() - since


def test_an_exported_localhost_master_is_refused_once_by_every_rank(slurm_cluster, tmp_path):
    done, took = srun_train(slurm_cluster, tmp_path, env={"MASTER_ADDR": "localhost"})
    assert done.returncode == 2 and took < 60
    (line,) = errors(done.stderr)
    assert "MASTER_ADDR=localhost but this job spans 2 nodes" in line and "HINT: unset" in line


def test_one_nodes_refusal_stops_every_rank_at_once(slurm_cluster, tmp_path):
    """Only the second node's ranks refuse (HPCDDP_DEVICE=cuda, no GPU there): all stop now."""
    on_node_1 = '[ "$SLURM_NODEID" = 1 ] && export HPCDDP_DEVICE=cuda; exec "$@"'
    done, took = srun_train(slurm_cluster, tmp_path, prefix=("bash", "-c", on_node_1, "bash"))
    assert done.returncode == 2 and took < 60, done.stderr[-2000:]
    (line,) = errors(done.stderr)
    node = slurm_cluster.nodes[1]
    assert line.startswith(f"hpcddp: error: (ranks 2, 3 on {node}) HPCDDP_DEVICE=cuda but")


def test_arbitrary_distribution_puts_the_master_where_rank_0_runs(slurm_cluster, tmp_path):
    first, second = slurm_cluster.nodes[:2]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{second}\n{first}\n{first}\n{second}\n")
    srun = f"srun -n4 --distribution=arbitrary {PY} -m hpcddp"
    script = (
        f"export SLURM_HOSTFILE={hostfile}; {srun} env --json; "
        f"{srun} train {QUICKSTART} run.dir={tmp_path / 'run'} " + " ".join(f"'{o}'" for o in TINY)
    )
    done = slurm_cluster.run("salloc", "-N2", "-n4", "bash", "-c", script, timeout=300)
    envs = sorted(
        (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")),
        key=lambda e: e["rank"],
    )
    assert [e["hostname"] for e in envs] == [second, first, first, second]
    assert {e["master_addr"] for e in envs} == {second}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["hosts"] == [second, first, first, second]


def test_wrappers_and_leftovers_resolve_to_the_step(slurm_cluster):
    """A wrapper that only copies Slurm's numbers into RANK/WORLD_SIZE, and HPCDDP_LOCAL_*
    variables left in the submitting shell: the step is still four ranks on two nodes."""
    wrapper = 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS exec "$@"'
    leftovers = {
        "HPCDDP_LOCAL_RANK": "1",
        "HPCDDP_LOCAL_WORLD_SIZE": "2",
        "HPCDDP_LOCAL_JOB_ID": "7",
    }
    done = slurm_cluster.run(
        "srun", "--nodes=2", "--ntasks-per-node=2", "bash", "-c", wrapper, "bash",
        PY, "-m", "hpcddp", "env", "--json", extra_env=leftovers,
    )  # fmt: skip
    envs = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda e: e["rank"])
    assert [(e["launcher"], e["rank"], e["local_rank"], e["world_size"]) for e in envs] == [
        ("slurm", r, r % 2, 4) for r in range(4)
    ]
    assert [e["hostname"] for e in envs] == slurm_cluster.ranks_on(2, 2)


SUBMIT_LOCAL = """
import hpcddp
job = hpcddp.submit("{config}", ["run.dir={run}", {tiny}], cluster="local", tasks_per_node=2)
job.result()
"""


@pytest.mark.slow
def test_submitit_local_inside_a_many_task_step_is_refused(slurm_cluster, tmp_path):
    code = SUBMIT_LOCAL.format(
        config=QUICKSTART, run=tmp_path / "run", tiny=", ".join(map(repr, TINY))
    )
    done = slurm_cluster.run(
        "srun", "--nodes=1", "--ntasks=2", PY, "-c", code, timeout=300, check=False
    )
    assert done.returncode != 0
    assert "local launcher (SUBMITIT_LOCAL_*) runs inside task" in done.stdout + done.stderr
    assert "srun step of 2 tasks" in done.stdout + done.stderr
