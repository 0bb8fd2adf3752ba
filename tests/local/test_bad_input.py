"""Bad input through the real command line: one line that says what and how, non-zero, nothing lost.

Each case runs ``python -m hpcddp`` as a user would. The checks are the same for all: the exit
code, exactly one line on stderr (``hpcddp: error: ...`` with the expected words), no traceback,
and a run directory that is exactly as it was before.
"""

import hashlib
import pathlib
import re
import signal
import socket
import subprocess
import sys

import pytest

from hpcddp import exit_codes
from hpcddp.storage.checkpoint import CheckpointStore
from tests.fixtures.helpers import QUICK, REPO, TINY, run_cli, wait_for_step

QS = "examples/quickstart.yaml"
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d \[rank \d+/\d+ ")  # rank 0's progress log, not an error


def snapshot(root: pathlib.Path) -> dict[str, str]:
    """Every file under ``root`` and the sha256 of its bytes (the lock only says who ran last)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.fixture
def finished_run(tmp_path):
    """A run directory holding a finished single-process run."""
    run_dir = tmp_path / "run"
    done = run_cli("train", QS, f"run.dir={run_dir}", *TINY)
    assert done.returncode == 0, done.stderr
    return run_dir


def bad_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("run: {dir: [unclosed\n")
    return str(path)


def list_yaml(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    return str(path)


def a_file(tmp_path):
    path = tmp_path / "plain-file"
    path.write_text("not a directory")
    return str(path)


# (id, argv builder, extra environment, exit code, words the one line must contain)
CASES = [
    ("malformed-yaml", lambda t: ["train", bad_yaml(t)], {}, 2, "is not valid YAML at line"),
    ("config-not-mapping", lambda t: ["train", list_yaml(t)], {}, 2, "must be a mapping"),
    ("missing-config", lambda t: ["train", "nope.yaml"], {}, 2, "cannot read config nope.yaml"),
    (
        "unknown-key",
        lambda t: ["train", QS, "optim.lrr=1"],
        {},
        2,
        "unknown key optim.lrr; valid keys: optim.name",
    ),
    ("unknown-section", lambda t: ["train", QS, "optimizer.lr=1"], {}, 2, "unknown key optimizer"),
    (
        "wrong-type",
        lambda t: ["train", QS, "train.epochs=many"],
        {},
        2,
        "train.epochs must be int, got str 'many'",
    ),
    (
        "zero-batch",
        lambda t: ["train", QS, "data.batch_size=0"],
        {},
        2,
        "data.batch_size must be > 0",
    ),
    (
        "negative-epochs",
        lambda t: ["train", QS, "train.epochs=-1"],
        {},
        2,
        "train.epochs must be > 0",
    ),
    ("negative-lr", lambda t: ["train", QS, "optim.lr=-0.1"], {}, 2, "optim.lr must be > 0"),
    (
        "zero-timeout",
        lambda t: ["train", QS, "dist.timeout_s=0"],
        {},
        2,
        "dist.timeout_s must be > 0",
    ),
    (
        "bad-precision",
        lambda t: ["train", QS, "train.precision=fp4"],
        {},
        2,
        "train.precision='fp4' is not one of",
    ),
    (
        "bad-backend",
        lambda t: ["train", QS, "dist.backend=mpi"],
        {},
        2,
        "dist.backend='mpi' is not one of",
    ),
    (
        "malformed-override",
        lambda t: ["train", QS, "optim..lr=1"],
        {},
        2,
        "is not of the form section.key=value",
    ),
    ("two-configs", lambda t: ["train", QS, QS], {}, 2, "more than one config file"),
    (
        "factory-does-not-import",
        lambda t: ["train", QS, f"run.dir={t}/r", "model.factory=no_such_pkg.models:make"],
        {},
        2,
        "cannot import 'no_such_pkg.models'",
    ),
    (
        "factory-missing-function",
        lambda t: ["train", QS, f"run.dir={t}/r", "model.factory=examples.quickstart:nope"],
        {},
        2,
        "'examples.quickstart' has no 'nope'",
    ),
    (
        "unwritable-run-dir",
        lambda t: ["train", QS, f"run.dir={a_file(t)}/run", *TINY],
        {},
        2,
        "cannot create run directory",
    ),
    (
        "batch-too-big-for-data",
        lambda t: [
            "train",
            QS,
            f"run.dir={t}/r",
            "data.drop_last=true",
            "data.kwargs={train_size: 16, eval_size: 16}",
        ],
        {},
        2,
        "gives each rank 16 samples, not one batch",
    ),
    (
        "invalid-hostlist",
        lambda t: ["env"],
        {
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_NODELIST": "node[3-1]",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
            "SLURM_JOB_ID": "7",
        },
        2,
        "SLURM_STEP_NODELIST",
    ),
    (
        "missing-slurm-variables-in-step",
        lambda t: ["env"],
        {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_JOB_ID": "7"},
        2,
        "SLURM_STEP_NUM_TASKS is not set",
    ),
    (
        "batch-shell-is-not-a-rank",
        lambda t: ["env"],
        {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "8"},
        2,
        "no job step",
    ),
    (
        "master-port-not-a-number",
        lambda t: ["env"],
        {"MASTER_PORT": "http"},
        2,
        "MASTER_PORT='http' is not an integer",
    ),
    (
        "bad-backend-variable",
        lambda t: ["env"],
        {"HPCDDP_BACKEND": "smoke"},
        2,
        "HPCDDP_BACKEND='smoke' is not one of",
    ),
    ("plot-without-metrics", lambda t: ["plot", str(t)], {}, 1, "metrics.jsonl"),
    (
        "hostile-partition",
        lambda t: ["sbatch", QS, "--partition", "a'; touch /tmp/pwned; '", "--dry-run"],
        {},
        2,
        "slurm.partition",
    ),
]


@pytest.mark.parametrize(
    "argv, environ, code, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_clear_line(tmp_path, argv, environ, code, words):
    result = run_cli(*argv(tmp_path), env=environ)
    lines = [line for line in result.stderr.strip().splitlines() if not LOG_LINE.match(line)]
    assert result.returncode == code, result.stderr
    assert len(lines) == 1 and lines[0].startswith("hpcddp: error: "), result.stderr
    assert words in lines[0]
    assert "HINT" in lines[0] or code == 1
    assert "Traceback" not in result.stderr


def test_different_config_never_overwrites_a_finished_run(finished_run):
    before = snapshot(finished_run)
    result = run_cli("train", QS, f"run.dir={finished_run}", *TINY, "optim.lr=0.5")
    assert result.returncode == 2
    assert "holds a run with a different config (optim.lr: 0.003 -> 0.5)" in result.stderr
    assert snapshot(finished_run) == before


def test_other_world_size_never_touches_the_run(finished_run):
    # as if its last attempt ran other code: a refused run must not record its own instead
    record = finished_run / "provenance.json"
    record.write_text(record.read_text().replace('"torch": "', '"torch": "0.0.1+'))
    before = snapshot(finished_run)
    result = run_cli("train", QS, f"run.dir={finished_run}", *TINY, "--nproc", "2")
    assert result.returncode == 2
    # one rank's global batch cannot be made by two (the refusal names sizes that can)
    assert "written by 1 ranks with a global batch of" in result.stderr
    assert "cannot make it" in result.stderr and "HINT: run on one of [1] ranks" in result.stderr
    assert {k: v for k, v in snapshot(finished_run).items() if not k.startswith("logs/")} == {
        k: v for k, v in before.items() if not k.startswith("logs/")
    }


def test_rerunning_a_finished_run_changes_nothing(finished_run):
    before = snapshot(finished_run)
    result = run_cli("train", QS, f"run.dir={finished_run}", *TINY)
    assert result.returncode == 0
    after = snapshot(finished_run)
    assert after["summary.json"] == before["summary.json"]
    assert {k for k in after if k.startswith("checkpoints/")} == {
        k for k in before if k.startswith("checkpoints/")
    }


def test_a_second_run_in_the_same_run_dir_is_refused_and_the_first_is_unharmed(tmp_path):
    run_dir = tmp_path / "run"
    # The first run is long on purpose: it must still hold the directory when the second starts.
    args = ["train", QS, f"run.dir={run_dir}", *QUICK, "train.epochs=1000"]
    args.append("train.log_every_steps=1")
    first = subprocess.Popen(
        [sys.executable, "-m", "hpcddp", *args], cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_step(run_dir, 2)
        second = run_cli(*args)
        assert second.returncode == 2, second.stderr
        lines = [line for line in second.stderr.splitlines() if not LOG_LINE.match(line)]
        assert lines == [
            f"hpcddp: error: run directory {run_dir} is in use by another run "
            f"(host {socket.gethostname()}, pid {first.pid}, since {lines[0].split('since ')[1]}"
        ]
        assert first.poll() is None  # the refusal did nothing to the running first run
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == exit_codes.INTERRUPTED, err[-3000:]
    assert CheckpointStore(run_dir).latest_step() is not None, err[-3000:]  # saved on Ctrl-C
    status = run_cli("status", str(run_dir))
    assert "held by:          nobody (not running now)" in status.stdout  # released on exit
