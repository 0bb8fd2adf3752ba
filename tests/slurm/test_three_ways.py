"""One config at world size 4 (2 nodes x 2 tasks), three ways in, the same final weights (the
three sharded: ``dist.strategy=fsdp``); and the ways to look inside an allocation: labelled
output, one rank under a debugger."""

import subprocess
import sys

import pytest

import hpcddp
from tests.fixtures.helpers import ENDED, QUICK, REPO, SHARDED, summary

pytestmark = pytest.mark.slow

CONFIG = "examples/quickstart.yaml"
GEOMETRY = ["--nodes=2", "--ntasks-per-node=2"]
OVERRIDES = [*QUICK, *SHARDED]


@pytest.fixture
def cluster(slurm_cluster, monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)
    monkeypatch.setenv("HPCDDP_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.chdir(REPO)
    return slurm_cluster


def test_sbatch_submit_and_salloc_srun_end_with_the_same_weights(cluster, tmp_path):
    # hpcddp.submit does not wait, so this job runs while the two below are started.
    job = hpcddp.submit(
        CONFIG, [f"run.dir={tmp_path}/submit", *OVERRIDES], nodes=2, tasks_per_node=2
    )
    batch = cluster.run(  # not waited for: it trains while salloc's job does
        "sbatch",
        "--parsable",
        *GEOMETRY,
        f"--output={tmp_path}/%x-%j.out",
        "sbatch/train.sh",
        CONFIG,
        f"run.dir={tmp_path}/sbatch",
        *OVERRIDES,
        timeout=300,
    )
    cluster.run(
        "salloc",
        *GEOMETRY,
        "srun",
        sys.executable,
        "-m",
        "hpcddp",
        "train",
        CONFIG,
        f"run.dir={tmp_path}/salloc",
        *OVERRIDES,
        timeout=300,
    )
    ended = cluster.wait_for(batch.stdout.strip(), ENDED, timeout=300)
    assert ended == "COMPLETED", cluster.output(tmp_path, batch.stdout.strip())[-4000:]
    job.result()

    runs = {way: summary(tmp_path / way) for way in ("sbatch", "submit", "salloc")}
    for way, done in runs.items():
        assert (done["world_size"], done["hosts"], done["launcher"]) == (
            4,
            cluster.ranks_on(2, 2),
            "slurm",
        ), way
    assert len({done["weights_sha256"] for done in runs.values()}) == 1, runs
    # and trained: an untrained model's loss is ln 4 = 1.39 (equal weights alone would not tell)
    assert all(done["final_loss"] < 1.0 for done in runs.values()), runs
    for way in runs:  # each rank wrote its own shards
        assert {c.suffix for c in (tmp_path / way / "checkpoints").iterdir()} == {".dcp"}, way
    assert len({done["steps"] for done in runs.values()}) == 1


def test_srun_label_prefixes_every_line_with_its_task(cluster):
    out = cluster.run(
        "salloc", *GEOMETRY, "srun", "--label", sys.executable, "-m", "hpcddp", "env"
    ).stdout
    lines = sorted(out.splitlines())
    assert len(lines) == 4
    for task, line in enumerate(lines):
        assert line.startswith(f"{task}: hpcddp env: rank={task} ")


def test_one_rank_under_pdb_the_others_as_usual(cluster, tmp_path):
    """`srun --multi-prog`: task 0 runs under pdb, fed from srun's stdin (--input=0)."""
    conf = tmp_path / "debug.conf"
    conf.write_text(
        f"0 {sys.executable} -m pdb -m hpcddp\n"
        f"* env PYTHONBREAKPOINT=0 {sys.executable} -m hpcddp\n"
    )
    run_dir = tmp_path / "run"
    # What a person would type at the first (Pdb) prompt; at the end pdb restarts the program,
    # reads end-of-file and quits.
    typed = "p 6 * 7\ncontinue\n"
    result = subprocess.run(
        [
            "salloc",
            *GEOMETRY,
            "srun",
            "--label",
            "--input=0",
            "--multi-prog",
            str(conf),
            "train",
            CONFIG,
            f"run.dir={run_dir}",
            *QUICK,
        ],
        input=typed,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=cluster.env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "0: (Pdb) 42" in result.stdout  # task 0 answered the typed command
    assert "The program exited via sys.exit(). Exit status: 0" in result.stdout
    assert {line.split(":")[0] for line in result.stdout.splitlines()} == {"0"}  # pdb: task 0
    done = summary(run_dir)
    assert done["world_size"] == 4 and done["hosts"] == cluster.ranks_on(2, 2)
