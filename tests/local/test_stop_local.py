"""Clean stops on one host: Ctrl-C, and a stop signal that reaches only one rank."""

import os
import signal
import subprocess
import time

import pytest

from hpcddp import exit_codes
from tests.fixtures.helpers import (
    EXACT,
    local_ranks,
    start_local,
    summary,
    train_local,
    wait_for_step,
)

pytestmark = pytest.mark.slow
# Long enough for a stop to land mid-run, at a walking pace (tests/fixtures/paced.py): the
# ranks sleep rather than burn the cores while the test waits for its moment.
PACED = [
    "model.factory=tests.fixtures.paced:make_model",
    "model.kwargs={sleep_s: 0.02, dropout: 0.1}",
]
LONG = [*EXACT, *PACED, "train.epochs=10", "train.log_every_steps=1"]


def start(run_dir):
    return start_local(
        run_dir, *LONG, start_new_session=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def checkpoint_steps(run_dir):
    return sorted(int(p.stem.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*.pt"))


def finish_and_compare(shared_run, run_dir):
    train_local(run_dir, *LONG)
    # made once a session, for both tests that stop this run
    straight = shared_run([*LONG, "--nproc", "2"], lambda made: train_local(made, *LONG, nproc=2))
    assert summary(run_dir)["weights_sha256"] == summary(straight)["weights_sha256"]


def test_ctrl_c_stops_every_rank_and_keeps_a_checkpoint(tmp_path, shared_run):
    run_dir = tmp_path / "run"
    launcher = start(run_dir)
    wait_for_step(run_dir, 30)
    os.killpg(launcher.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == exit_codes.INTERRUPTED, output[-3000:]
    assert "Traceback" not in output
    assert checkpoint_steps(run_dir)[-1] > 30
    assert not (run_dir / "summary.json").exists()
    assert not list((run_dir / "checkpoints").glob(".*tmp*"))
    finish_and_compare(shared_run, run_dir)


def test_signal_reaching_one_rank_stops_all_at_the_same_step(tmp_path, shared_run):
    run_dir = tmp_path / "run"
    launcher = start(run_dir)
    wait_for_step(run_dir, 30)
    ranks = local_ranks(launcher.pid)
    assert len(ranks) == 2
    os.kill(ranks[1].pid, signal.SIGUSR2)  # only one rank hears it; no deadlock, same stop step
    output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == exit_codes.STOPPED_NOT_REQUEUED, output[-3000:]
    assert "not a Slurm job, nothing to requeue" in output
    assert "re-run the same command to resume" in output
    finish_and_compare(shared_run, run_dir)


def test_stops_before_the_time_limit_without_any_signal(tmp_path):
    """No signal configured: the ranks still stop and checkpoint ahead of the job's end."""
    run_dir = tmp_path / "run"
    # what Slurm's SLURM_JOB_END_TIME / squeue %e would say: 40 s before the stop margin, time
    # enough for 2 ranks to start and reach their first deadline check on 2 loaded cores
    end = time.time() + 60
    launcher = start_local(
        run_dir, *LONG, "train.stop_before_end_s=20", "slurm.signal_delay_s=20",
        "train.epochs=1000",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "SLURM_JOB_END_TIME": str(int(end))},
    )  # fmt: skip
    output, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == exit_codes.STOPPED_NOT_REQUEUED, output[-3000:]
    assert time.time() < end  # stopped before the limit, not killed at it
    assert "preempted at step" in output and "checkpoint saved" in output
    assert checkpoint_steps(run_dir)
