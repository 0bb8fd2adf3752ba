"""The job script with slurm.setup and slurm.container, run against stand-ins for Slurm's tools.

`srun`, `scontrol` and `sinfo` are small scripts on PATH that record what they were given; the
stand-in `apptainer` records its arguments and runs the command after the image, as the real
one runs it inside. The rendered text itself is checked by the golden files in test_jobscript.
"""

import json
import os
import sys

import pytest

from hpcddp.config import from_dict
from hpcddp.slurm import jobscript
from tests.unit.test_jobscript import APPTAINER, PYXIS, calls, stub

RECORD = """#!/bin/bash
argv=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@")
printf '%s\\n' "$argv" >> "$STUB_DIR/$(basename "$0").json"
"""
# srun as a rank would see it die: srun's own error line on stderr, then the task's status.
DYING_SRUN = RECORD + 'echo "srun: error: n2: task 3: Killed" >&2\nexit 137\n'
# The stand-in apptainer: record, then run what follows the image (the argument after the
# options), as apptainer exec does inside the container.
APPTAINER_STANDIN = (
    RECORD
    + """
while [[ $# -gt 0 && $1 != *.sif ]]; do shift; done
shift
exec "$@"
"""
)
# The stand-in srun for pyxis: record, and run hpcddp's policy helper (an srun of one task
# inside the image) as the real one would; the ranks' step is only recorded.
PYXIS_SRUN = (
    RECORD
    + """
if [[ " $* " == *" hpcddp.slurm.policy "* ]]; then
    while [[ $1 == --* ]]; do shift; done
    exec "$@"
fi
"""
)
SINFO = "#!/bin/bash\nprintf 'n1 idle\\nn2 mixed\\nn3 idle\\n'\n"


@pytest.fixture
def job(tmp_path):
    """Render a job script for a slurm section; run it under the stand-ins; return the result."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "scontrol"):
        stub(bin_dir, name, RECORD)
    stub(bin_dir, "apptainer", APPTAINER_STANDIN)
    stub(bin_dir, "sinfo", SINFO)
    env = {
        **os.environ,
        "SLURM_JOB_ID": "4242",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_PARTITION": "debug",
        "STUB_DIR": str(tmp_path),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }

    def run(slurm, *args, srun=None, check=False, environ=None):
        import subprocess

        if srun is not None:
            stub(bin_dir, "srun", srun)
        config = tmp_path / "run.yaml"
        config.write_text(json.dumps({"run": {"dir": str(tmp_path / "run")}}))
        script = tmp_path / "job.sbatch"
        slurm_config = from_dict({"slurm": slurm})
        text = jobscript.render(
            jobscript.JobSpec(slurm_config, str(config), python=sys.executable, check=check)
        )
        script.write_text(text)
        command = ["bash", str(script), *args]
        return subprocess.run(
            command, env={**env, **(environ or {})}, capture_output=True, text=True, timeout=120
        )

    return run


def test_ranks_run_inside_apptainer_after_the_setup_lines(job, tmp_path):
    setup = ["export FROM_SETUP=$SLURM_JOB_ID", 'echo "$FROM_SETUP$UNSET" > "$STUB_DIR/setup"']
    slurm = {**APPTAINER, "setup": setup, "gpus_per_node": 4}  # $UNSET: -u is off for setup
    done = job(slurm)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "setup").read_text() == "4242\n"  # ran in the batch shell, before srun
    (srun,) = calls(tmp_path, "srun")
    image = APPTAINER["container"]["image"]
    binds = ["--bind", "/scratch", "--bind", "/data:/data:ro"]
    assert srun[:8] == ["--kill-on-bad-exit=1", "apptainer", "exec", "--nv", *binds]
    assert srun[8:10] == ["--writable-tmpfs", image]
    assert srun[10:14] == [sys.executable, "-m", "hpcddp", "train"]


# srun that records what the container runtime will read from its environment (and, as
# PYXIS_SRUN, runs the policy helper's own steps into the image)
GPU_ENV_SRUN = PYXIS_SRUN + (
    'printf "%s|%s\\n" "${APPTAINER_NV:-}" "${NVIDIA_VISIBLE_DEVICES:-}" > "$STUB_DIR/gpu-env"\n'
)


@pytest.mark.parametrize(
    "container, slurm_env, seen",
    [
        (APPTAINER["container"], {"SLURM_JOB_GPUS": "0,1"}, "1|"),
        (APPTAINER["container"], {"SLURM_GPUS_ON_NODE": "4"}, "1|"),
        (APPTAINER["container"], {"SLURM_GPUS_ON_NODE": "0"}, "|"),
        (PYXIS["container"], {"SLURM_JOB_GPUS": "3"}, "|all"),
        (PYXIS["container"], {}, "|"),
    ],
)
def test_the_container_gets_the_gpus_whenever_slurm_gave_some(
    job, tmp_path, container, slurm_env, seen
):
    # rendered without slurm.gpus_per_node: `sbatch --gpus-per-node=2 job.sbatch` still gets them
    done = job({"container": container}, srun=GPU_ENV_SRUN, environ=slurm_env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "gpu-env").read_text().strip() == seen


def test_pyxis_enters_the_image_through_srun_options(job, tmp_path):
    done = job(PYXIS, check=True, srun=PYXIS_SRUN)
    assert done.returncode == 0, done.stderr
    helper, srun, helper_after = calls(tmp_path, "srun")
    assert helper[:2] == ["--nodes=1", "--ntasks=1"] and "hpcddp.slurm.policy" in helper
    assert helper_after[helper_after.index("hpcddp.slurm.policy") + 1] == "after"
    assert srun[:4] == [
        "--kill-on-bad-exit=1",
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        "--container-mounts=/scratch:/scratch",
        f"--container-workdir={os.getcwd()}",  # the batch shell's, where sbatch was run
    ]
    assert srun[4:8] == [sys.executable, "-m", "hpcddp", "check"]  # rendered with --check


def test_check_as_the_scripts_first_argument(job, tmp_path):
    done = job({}, "--check", "train.max_steps=1")
    assert done.returncode == 0, done.stderr
    (srun,) = calls(tmp_path, "srun")
    assert srun[2:6] == ["-m", "hpcddp", "check", f"--config={tmp_path / 'run.yaml'}"]
    assert srun[-1] == "train.max_steps=1"


def test_a_dead_rank_requeues_the_job_without_its_node_from_outside_the_container(job, tmp_path):
    done = job({"container": APPTAINER["container"]}, srun=DYING_SRUN)
    assert done.returncode == 137, done.stderr
    assert "hpcddp: task 3 on n2: Killed; requeueing job 4242 without n2" in done.stderr
    assert "srun: error: n2: task 3: Killed" in done.stderr  # still in the job's output
    # the helper ran inside the container, Slurm's tools outside it
    helper = calls(tmp_path, "apptainer")[-1]
    python = helper.index(sys.executable)
    assert helper[python : python + 5] == [
        sys.executable,
        "-m",
        "hpcddp.slurm.policy",
        "after",
        "--status",
    ]
    assert calls(tmp_path, "scontrol") == [
        ["-o", "show", "job", "4242"],
        ["requeue", "4242"],
        ["update", "jobid=4242", "ExcNodeList=n2"],
    ]
    (record,) = map(json.loads, (tmp_path / "run" / "attempts.jsonl").read_text().splitlines())
    assert record["cause"] == "failed: task 3 on n2: Killed" and record["nodes"] == ["n1", "n2"]


def test_a_second_failure_without_progress_stops(job, tmp_path):
    job({}, srun=DYING_SRUN)
    done = job({}, srun=DYING_SRUN)  # the requeued attempt dies the same way, no step saved
    assert done.returncode == 137 and "not retried: this retry gained no step" in done.stderr
    assert [c[0] for c in calls(tmp_path, "scontrol")].count("requeue") == 1


def test_bad_input_is_never_retried(job, tmp_path):
    done = job(
        {}, srun=RECORD + 'echo "srun: error: n1: task 0: Exited with exit code 2" >&2\nexit 2\n'
    )
    assert done.returncode == 2 and "not retried: bad input fails on every node" in done.stderr
    assert [c[0] for c in calls(tmp_path, "scontrol")] == ["-o"]


# Inside a container a stopped rank cannot requeue: it exits 75, and --kill-on-bad-exit ends
# the others, so srun itself reports "Terminated" (143).
STOPPED_SRUN = RECORD + (
    'echo "srun: error: n2: task 1: Exited with exit code 75" >&2\n'
    'echo "srun: error: n1: task 0: Terminated" >&2\nexit 143\n'
)


def test_the_first_ranks_exit_75_is_the_steps_answer_and_the_shell_requeues(job, tmp_path):
    done = job({"container": APPTAINER["container"]}, srun=STOPPED_SRUN)
    assert done.returncode == 75
    assert "hpcddp: the step stopped to be requeued; requeueing job 4242" in done.stderr
    requeues = [c for c in calls(tmp_path, "scontrol") if c[0] != "-o"]
    assert requeues == [["requeue", "4242"]]  # no node blamed
    assert not (tmp_path / "run" / "attempts.jsonl").exists()


def test_submit_starts_python_inside_apptainer_and_asks_srun_for_pyxis(monkeypatch, tmp_path):
    import shlex
    import shutil

    from hpcddp.slurm import submission

    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")  # "srun exists"
    config = from_dict({"run": {"dir": str(tmp_path)}, "slurm": {**APPTAINER, "gpus_per_node": 1}})
    setup = submission.executor_parameters(config.slurm)["slurm_setup"]
    assert setup[2:] == APPTAINER["setup"]
    assert "SLURM_JOB_GPUS" in setup[1] and "export APPTAINER_NV=1" in setup[1]
    executor = submission.executor_for(config, "slurm")
    image = shlex.quote(APPTAINER["container"]["image"])
    assert executor._executor.python == (
        "apptainer exec --nv --bind /scratch --bind /data:/data:ro --writable-tmpfs "
        f"{image} {shlex.quote(sys.executable)}"
    )
    pyxis = from_dict({"slurm": PYXIS})
    assert submission.executor_parameters(pyxis.slurm)["slurm_srun_args"] == [
        "--kill-on-bad-exit=1",
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        "--container-mounts=/scratch:/scratch",
    ]
