"""`sbatch sbatch/train.sh` end to end on the real local multi-node cluster."""

import json
import sys

import pytest

from tests.fixtures.helpers import QUICK, REPO, summary

pytestmark = pytest.mark.slow

# Two epochs of the quick run, logged every 4 steps.
TWO_EPOCHS = [*QUICK, "train.epochs=2", "train.log_every_steps=4"]


def test_two_nodes_two_tasks_each(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    job_id, _output = slurm_cluster.sbatch(
        tmp_path,
        "sbatch/train.sh",
        "examples/quickstart.yaml",
        f"run.dir={run_dir}",
        *TWO_EPOCHS,
        options=("--nodes=2", "--ntasks-per-node=2", "--job-name=itest"),
    )
    done = summary(run_dir)
    assert done["world_size"] == 4
    assert done["hosts"] == slurm_cluster.ranks_on(2, 2)  # two distinct hosts, block order
    assert done["launcher"] == "slurm" and done["job_id"] == job_id
    assert done["steps"] == 2 * 2048 // 4 // 32
    assert len(done["weights_sha256"]) == 64  # written only after every rank's hash agreed
    assert (tmp_path / f"itest-{job_id}.out").exists()  # named by job name and id

    # Only rank 0 wrote the run's files; each rank wrote nothing but its own log.
    files = {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()}
    logs = {f"logs/rank-{r}.log" for r in range(4)}
    assert logs <= files
    assert {f for f in files - logs if not f.startswith(("checkpoints/", "provenance/"))} == {
        ".lock",  # the run-dir lock: a second run here is refused while this one holds it
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "attempts.jsonl",
        "starts.jsonl",  # the attempt's start, for `hpcddp report`
        "provenance.json",
    }
    for rank in range(4):
        text = (run_dir / f"logs/rank-{rank}.log").read_text()
        assert f"[rank {rank}/4 {slurm_cluster.nodes[rank // 2]}]" in text
        assert ("saved checkpoint" in text) == (rank == 0)
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["step"] == 4


def test_default_config_and_python_override(slurm_cluster, tmp_path):
    """No CONFIG argument: the quickstart runs; HPCDDP_PYTHON picks the interpreter."""
    run_dir = tmp_path / "run"
    _job_id, output = slurm_cluster.sbatch(
        tmp_path,
        "sbatch/train.sh",
        f"run.dir={run_dir}",
        *QUICK,
        "train.max_steps=3",
        options=(
            "--nodes=1",
            "--ntasks-per-node=2",
            f"--export=ALL,HPCDDP_PYTHON={sys.executable}",
        ),
    )
    assert "config examples/quickstart.yaml" in output
    assert summary(run_dir)["world_size"] == 2


def test_bad_override_fails_the_job_with_one_line(slurm_cluster, tmp_path):
    result = slurm_cluster.run(
        "sbatch",
        "--parsable",
        "--wait",
        f"--output={tmp_path}/%x-%j.out",
        "--nodes=1",
        "--ntasks-per-node=2",
        "sbatch/train.sh",
        "optim.lr=fast",
        timeout=300,
        check=False,
    )
    assert result.returncode != 0
    output = next(tmp_path.glob("*.out")).read_text()
    assert "hpcddp: error: optim.lr must be float, got str 'fast'" in output


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)
