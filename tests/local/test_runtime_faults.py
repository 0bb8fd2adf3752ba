"""Runtime bad input through the real command line, two ranks on this host.

A fault in one rank's factory, datasets that differ between ranks, a factory that cannot take
its kwargs, a forward that raises, a device or backend that cannot work, a checkpoint of another
model, and a second Ctrl-C during the stop checkpoint. Each ends every rank soon with exactly
one ``hpcddp: error:`` line that names the fix, a non-zero status, and nothing lost; where the
user's code raised, its traceback appears once, trimmed to the user's frames.
"""

import hashlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from hpcddp import exit_codes
from hpcddp.storage.checkpoint import CheckpointStore
from tests.fixtures.helpers import (
    EXACT,
    QUICKSTART,
    REPO,
    TINY,
    line_of,
    run_cli,
    summary,
    train_local,
    wait_until,
)

LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d \[rank \d+/\d+ ")  # a rank's log line, not an error
ERROR = "hpcddp: error: "
SETUP = "tests.fixtures.faulty_setup"


def errors_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(ERROR)]


def frames_in(stderr: str) -> list[str]:
    """The ``File "..."`` lines of every traceback printed."""
    return [line for line in stderr.splitlines() if line.lstrip().startswith('File "')]


# (id, overrides, environment, exit status, words of the one line, whether the user's traceback
# is shown (once) and the file:line of the user's frame the line names)
CASES = [
    (
        "model-factory-raises-on-rank-1",
        [f"model.factory={SETUP}:make_model", "model.kwargs={fail_on_rank: 1}"],
        {},
        1,
        "the model factory tests.fixtures.faulty_setup:make_model raised on rank 1 (",
        f"{line_of('tests/fixtures/faulty_setup.py', 'raise ValueError')} in check_width",
    ),
    (
        "dataset-factory-raises-on-rank-0",
        [
            f"data.factory={SETUP}:make_dataset",
            "data.kwargs={train_size: 256, eval_size: 64, fail_on_rank: 0}",
        ],
        {},
        1,
        "FileNotFoundError: /data/shard-0.bin is not on this node",
        f"{line_of('tests/fixtures/faulty_setup.py', 'raise FileNotFoundError')} in make_dataset",
    ),
    (
        "dataset-shorter-on-one-rank",
        [
            f"data.factory={SETUP}:make_dataset",
            "data.kwargs={train_size: 256, eval_size: 64, short_on_rank: 1}",
        ],
        {},
        1,
        "training sets of different lengths (rank 0: 256; rank 1: 255)",
        None,
    ),
    (
        "factory-needs-an-argument",
        [f"model.factory={SETUP}:make_model_needing_width", "model.kwargs={}"],
        {},
        2,
        "cannot be called with model.kwargs={}: missing a required argument: 'width'",
        None,
    ),
    (
        "factory-returns-nothing",
        [f"model.factory={SETUP}:make_nothing", "model.kwargs={}"],
        {},
        2,
        "the model factory returned NoneType, not a torch.nn.Module",
        None,
    ),
    (
        "factory-names-a-constant",
        [f"model.factory={SETUP}:NOT_A_FUNCTION"],
        {},
        2,
        "names a int, not a function",
        None,
    ),
    (
        "factory-module-raises-on-import",
        ["model.factory=tests.fixtures.broken_factories:make_model"],
        {},
        2,
        "importing 'tests.fixtures.broken_factories' raised KeyError: 'depth'",
        None,
    ),
    (
        "forward-raises-on-rank-1",
        [
            "model.factory=tests.fixtures.faulty_model:make_model",
            "model.kwargs={rank: 1, at_call: 1}",
        ],
        {},
        1,
        "(rank 1) your code in training raised on rank 1 (",
        f"{line_of('tests/fixtures/faulty_model.py', 'raise RuntimeError')} in forward",
    ),
    (
        "model-factory-hangs-on-rank-1",
        [f"model.factory={SETUP}:make_model", "model.kwargs={hang_on_rank: 1}", "dist.timeout_s=5"],
        {},
        1,
        "waited dist.timeout_s=5 s for rank 1 to finish building its model and data",
        None,
    ),
    ("device-gpu", [], {"HPCDDP_DEVICE": "gpu"}, 2, "HPCDDP_DEVICE='gpu' is not a device", None),
    ("device-cuda-9", [], {"HPCDDP_DEVICE": "cuda:9"}, 2, "HPCDDP_DEVICE=cuda:9 but", None),
    ("backend-variable-nccl", [], {"HPCDDP_BACKEND": "nccl"}, 2, "=nccl needs CUDA", None),
    ("config-backend-nccl", ["dist.backend=nccl"], {}, 2, "dist.backend=nccl needs CUDA", None),
]


@pytest.mark.parametrize(
    "overrides, environ, code, words, frame",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_a_runtime_fault_ends_every_rank_with_one_line(tmp_path, overrides, environ, code, words,
                                                       frame):  # fmt: skip
    started = time.monotonic()
    args = ["train", QUICKSTART, f"run.dir={tmp_path}/run", *TINY, *overrides, "--nproc", "2"]
    done = run_cli(*args, env=environ, timeout=120)
    took = time.monotonic() - started
    lines = errors_in(done.stderr)
    assert done.returncode == code, done.stderr[-3000:]
    assert len(lines) == 1 and words in lines[0] and "HINT: " in lines[0], done.stderr[-3000:]
    assert took < 60  # every rank ended at once: no rank waited for a timeout
    frames = frames_in(done.stderr)
    if frame is None:
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        return
    assert f"at {frame}. HINT: " in lines[0]
    assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr[-3000:]
    assert frames and not [f for f in frames if f"{os.sep}hpcddp{os.sep}" in f], frames
    assert not re.search(r"ProcessGroup|Connection (closed|reset)|c10d", done.stderr)


def digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_a_checkpoint_of_another_model_names_the_first_misfit_and_is_kept(tmp_path):
    run_dir = tmp_path / "run"
    train_local(run_dir, *TINY, nproc=1)
    before = digests(run_dir / "checkpoints")
    # run.force keeps the run directory despite the new config: the weights must still fit
    done = run_cli("train", QUICKSTART, f"run.dir={run_dir}", *TINY, "run.force=true",
                   "model.kwargs={hidden: 128}")  # fmt: skip
    lines = errors_in(done.stderr)
    assert done.returncode == exit_codes.USAGE, done.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (
        "does not fit this model (first mismatched parameter '0.weight': checkpoint (256, 16) "
        "vs model (128, 16))" in lines[0]
    )
    assert "HINT: choose a new run.dir" in lines[0]
    assert digests(run_dir / "checkpoints") == before


@pytest.mark.slow
def test_a_second_ctrl_c_during_the_stop_checkpoint_leaves_it_complete(tmp_path):
    """Ctrl-C, then Ctrl-C again while the stop checkpoint is being written (in the background,
    each write() slowed down): the checkpoint is finished, verifies, and the run resumes from
    it to the same weights as a run never interrupted."""
    slow = [
        "model.factory=tests.fixtures.slow_writes:make_model",
        "model.kwargs={write_delay_s: 0.5}",
    ]
    # no scheduled checkpoint: the only file ever being written is the stop checkpoint
    args = [*EXACT, *slow, "train.log_every_steps=1", "train.checkpoint_every_steps=1000"]
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "hpcddp", "train", QUICKSTART, f"run.dir={run_dir}", *args]
    run = subprocess.Popen([*command, "--nproc", "2"], cwd=REPO, start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    checkpoints = run_dir / "checkpoints"
    try:
        wait_until(lambda: (run_dir / "metrics.jsonl").exists(), "the first step")
        os.killpg(run.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches every rank
        wait_until(lambda: list(checkpoints.glob(".step-*.pt.tmp-*")), "the stop checkpoint")
        writing = next(checkpoints.glob(".step-*.pt.tmp-*")).name
        os.killpg(run.pid, signal.SIGINT)  # ... and again, while it is being written
        output, _ = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == exit_codes.INTERRUPTED, output[-3000:]
    assert "stopping once the checkpoint being written is complete" in output
    step = int(writing.split("-")[1].split(".")[0])
    store = CheckpointStore(run_dir)
    assert store.latest_step() == step, output[-3000:]  # finished, not torn or lost
    store.verify(store.path_for(step))
    assert not list(checkpoints.glob(".*"))  # no debris
    train_local(run_dir, *args)
    train_local(tmp_path / "straight", *args)
    assert summary(run_dir)["weights_sha256"] == summary(tmp_path / "straight")["weights_sha256"]
