"""Checkpoints written in the background: a kill -9 mid-write, and a stop with a write in flight.

Both runs name `tests.fixtures.slow_writes:make_model`, the quickstart model with every checkpoint
write() delayed, so there is time to act while a background write is under way.
"""

import os
import signal
import subprocess
import sys

import pytest

from hpcddp import exit_codes
from hpcddp.storage.checkpoint import CheckpointStore
from tests.fixtures.checkpoints import read
from tests.fixtures.helpers import EXACT, QUICKSTART, REPO, summary, train_local, wait_until

pytestmark = pytest.mark.slow


def hpcddp_train(run_dir, *args, nproc=None):
    command = [sys.executable, "-m", "hpcddp", "train", QUICKSTART, f"run.dir={run_dir}", *args]
    return subprocess.Popen(
        [*command, *(["--nproc", str(nproc)] if nproc else [])],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def writing(run_dir, step):
    """A temp file of checkpoint ``step`` exists: its write is in flight."""
    return any((run_dir / "checkpoints").glob(f".step-{step:08d}.pt.tmp-*"))


def test_kill_9_during_a_background_write_leaves_the_previous_checkpoint_latest(tmp_path):
    slow = [
        "model.factory=tests.fixtures.slow_writes:make_model",
        "model.kwargs={write_delay_s: 3}",
    ]
    args = [*EXACT, *slow, "train.checkpoint_every_steps=2", "train.max_steps=6"]
    run = hpcddp_train(tmp_path, *args)
    try:
        wait_until(lambda: (tmp_path / "checkpoints" / "step-00000002.pt").exists(), "step 2")
        wait_until(lambda: writing(tmp_path, 4), "the write of step 4")
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
    finally:
        run.kill()
    store = CheckpointStore(tmp_path)
    step = store.latest_step()
    assert step == 2 and read(store, store.path_for(step))["progress"]["step"] == 2
    assert writing(tmp_path, 4)  # the torn write is left as debris that resume never loads


def test_a_stop_with_a_write_in_flight_waits_for_it_and_resumes_exactly(tmp_path):
    slow = [
        "model.factory=tests.fixtures.slow_writes:make_model",
        "model.kwargs={write_delay_s: 0.3}",
    ]
    args = [*EXACT, *slow, "train.epochs=1", "train.checkpoint_every_steps=4"]
    run_dir = tmp_path / "stopped"
    run = hpcddp_train(run_dir, *args, nproc=2)
    wait_until(lambda: any(writing(run_dir, s) for s in (4, 8)), "a write in flight")
    os.killpg(run.pid, signal.SIGUSR2)  # every rank hears it, as under Slurm's --signal
    output, _ = run.communicate(timeout=120)
    assert run.returncode == exit_codes.STOPPED_NOT_REQUEUED, output[-3000:]
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "waiting for the checkpoint of step" in log  # the stop found a write in flight
    train_local(run_dir, *args)
    train_local(tmp_path / "straight", *args)
    assert summary(run_dir)["weights_sha256"] == summary(tmp_path / "straight")["weights_sha256"]


def test_a_corrupt_latest_checkpoint_is_skipped_by_every_rank(tmp_path):
    args = [*EXACT, "train.epochs=1", "train.checkpoint_every_steps=4"]
    run_dir = tmp_path / "run"
    train_local(run_dir, *args, "train.stop_after_steps=9")
    latest = run_dir / "checkpoints" / "step-00000009.pt"
    data = bytearray(latest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    latest.write_bytes(bytes(data))
    train_local(run_dir, *args)
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "skipping checkpoint" in log and "resumed from step 8" in log
    train_local(tmp_path / "straight", *args)
    assert summary(run_dir)["weights_sha256"] == summary(tmp_path / "straight")["weights_sha256"]
