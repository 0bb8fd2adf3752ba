"""Notices from real runs (2 ranks on this machine, no Slurm): rank 0 alone posts, once per
event, and a webhook that never answers costs training nothing measurable."""

import time

from tests.fixtures.helpers import TINY, run_cli, train_local
from tests.fixtures.webhook import Receiver

TWO_STEPS = [*TINY, "train.log_every_steps=1"]


def train_two_ranks(tmp_path, receiver: Receiver, factory: str, kwargs: str):
    """``hpcddp train --nproc 2`` of the quickstart with ``factory``, told to ``receiver``."""
    return run_cli(
        "train", "examples/quickstart.yaml", f"run.dir={tmp_path / 'run'}", *TWO_STEPS,
        f"model.factory={factory}", f"model.kwargs={kwargs}",
        f"notify.url={receiver.url}", "--nproc", "2",
    )  # fmt: skip


def test_a_webhook_that_never_answers_delays_training_by_nothing_measurable(tmp_path):
    began = time.perf_counter()
    train_local(tmp_path / "quiet", *TWO_STEPS)
    alone = time.perf_counter() - began
    with Receiver(answer=False) as receiver:
        began = time.perf_counter()
        # its answer would take 60 s: a run that waited for it would show it
        train_local(tmp_path / "told", *TWO_STEPS, f"notify.url={receiver.url}",
                    "notify.timeout_s=60")  # fmt: skip
        told = time.perf_counter() - began
        bodies = receiver.wait_for(2)
    print(f"2 ranks, 2 steps: {alone:.2f} s without a webhook, {told:.2f} s posting to one "
          "that never answers (noisy: a shared 2-core machine)")  # fmt: skip
    # rank 0 alone posted, each event once; both left before the ranks did
    assert [(b["event"], b["job"], b["step"]) for b in bodies] == [
        ("started", "local", 0),
        ("completed", "local", 2),
    ]
    assert told < alone + 5.0  # generous: the run's own time varies by seconds under load


def test_a_failed_run_is_told_once_with_what_failed(tmp_path):
    with Receiver() as receiver:
        result = train_two_ranks(tmp_path, receiver, "tests.fixtures.faulty_model:make_model",
                                 "{rank: 0, at_call: 2, mode: raise}")  # fmt: skip
        assert result.returncode != 0
        _, failed = receiver.wait_for(2)
        time.sleep(0.3)  # a duplicate would have arrived by now
    assert receiver.events() == ["started", "failed"]
    assert "injected failure on rank 0" in failed["text"], failed["text"]


def test_a_run_that_fails_while_being_built_is_told(tmp_path):
    """The model factory raises on rank 1, before any step: rank 0 still posts "failed", with
    the one line every rank agreed on (under --nproc or submitit no job script tells it)."""
    with Receiver() as receiver:
        result = train_two_ranks(tmp_path, receiver, "tests.fixtures.faulty_setup:make_model",
                                 "{fail_on_rank: 1}")  # fmt: skip
        assert result.returncode == 1, result.stderr
        (failed,) = receiver.wait_for(1)
        time.sleep(0.3)  # a duplicate would have arrived by now
    assert receiver.events() == ["failed"]
    assert (failed["step"], failed["job"]) == (0, "local")
    said = "the model factory tests.fixtures.faulty_setup:make_model raised on rank 1"
    assert said in failed["text"], failed["text"]
