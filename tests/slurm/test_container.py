"""A containerised job on the real cluster: a stand-in `apptainer` (it records its arguments and
runs the command after the image, without Slurm's tools, as inside a real image) runs every
rank; a preemption cannot requeue from inside, so the batch shell does; the resumed run ends with
the same weights as one that ran straight through."""

import sys

import pytest

from tests.fixtures.helpers import QUICK, REPO, summary, wait_for_step, wait_until
from tests.fixtures.resume_proof import prove_resumed

pytestmark = pytest.mark.slow

STANDIN = """#!/bin/bash
# apptainer exec [options] IMAGE COMMAND...: record, then run COMMAND as the image would.
printf '%s\\n' "$*" >> "$APPTAINER_LOG"
while [[ $# -gt 0 && $1 != *.sif ]]; do shift; done
shift
export PATH=/opt/image/bin  # inside the image: no scontrol, no squeue
exec "$@"
"""
LONGER = [*QUICK, "train.epochs=4", "train.log_every_steps=1"]


def test_a_containerised_job_is_preempted_requeued_by_its_shell_and_resumes_exactly(
    slurm_cluster, tmp_path
):
    bin_dir, log = tmp_path / "bin", tmp_path / "apptainer.log"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(STANDIN)
    (bin_dir / "apptainer").chmod(0o755)
    straight, run_dir = tmp_path / "straight", tmp_path / "contained"

    def show(job):
        return slurm_cluster.run("scontrol", "-o", "show", "job", job).stdout

    env = {
        "PATH": f"{bin_dir}:{slurm_cluster.env['PATH']}",
        "APPTAINER_LOG": str(log),
        "PYTHONPATH": str(REPO),
    }
    container = [
        "slurm.container.runtime=apptainer",
        "slurm.container.image=/images/train.sif",
        f"slurm.container.bind=[{tmp_path}]",
        "slurm.setup=[export FROM_SETUP=1]",
    ]
    submitted = slurm_cluster.run(
        sys.executable, "-m", "hpcddp", "sbatch", str(REPO / "examples/quickstart.yaml"),
        "--nodes", "2", "--tasks-per-node", "1", "--job-name", "contained",
        f"run.dir={run_dir}", *LONGER, *container,
        cwd=tmp_path, extra_env=env,
    )  # fmt: skip
    job_id = submitted.stdout.strip()
    reference, _ = slurm_cluster.sbatch(  # the same run without a container, meanwhile
        tmp_path, "sbatch/train.sh", "examples/quickstart.yaml", f"run.dir={straight}", *LONGER,
        options=("--nodes=2", "--ntasks-per-node=1"), wait=False,
    )  # fmt: skip
    try:
        wait_for_step(run_dir, 20, timeout=180)
        # what --signal=B:USR2@... does before the time limit: USR2 to the batch shell only
        slurm_cluster.run("scancel", "--signal=USR2", "--batch", job_id)
        wait_until(
            lambda: (
                "Restarts=1" in slurm_cluster.run("scontrol", "-o", "show", "job", job_id).stdout
            ),
            "the requeue by the batch shell",
            timeout=180,
        )
        slurm_cluster.wait_for(job_id, {"PENDING"}, timeout=60)
        slurm_cluster.release(job_id)
        final = slurm_cluster.wait_for(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        slurm_cluster.wait_for(reference, {"COMPLETED"}, timeout=300)
    finally:
        slurm_cluster.run("scancel", job_id, reference, check=False)
    output = (tmp_path / f"contained-{job_id}.out").read_text()
    assert final == "COMPLETED", output[-4000:]
    assert "scontrol is not on PATH here (container without Slurm tools?)" in output
    assert f"hpcddp: the step stopped to be requeued; requeueing job {job_id}" in output
    calls = log.read_text().splitlines()
    assert any(
        c.startswith(f"exec --bind {tmp_path} /images/train.sif {sys.executable} -m hpcddp train")
        for c in calls
    )
    got, expected = summary(run_dir), summary(straight)
    assert got["weights_sha256"] == expected["weights_sha256"] and got["steps"] == expected["steps"]
    assert [a["cause"] for a in got["attempts"]] == ["preempted", "finished"]
    (resumed_at,) = prove_resumed(run_dir, resumes=1)
    assert resumed_at >= 20  # preempted once it had logged step 20: saved where it stopped
