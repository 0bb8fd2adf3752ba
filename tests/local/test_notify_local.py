"""Notices from real runs (2 ranks on this machine, no Slurm): rank 0 alone posts, once per
event, and a webhook that never answers costs training nothing measurable."""

import time

from hpcddp.notify import poster
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


def leaving_after_completed(run_dir, receiver: Receiver) -> tuple[list[dict], float]:
    """A 2-rank run told to ``receiver``: its bodies, and the seconds from its "completed"
    post's arrival to the run's exit (all that is left for a webhook to delay)."""
    train_local(run_dir, *TWO_STEPS, f"notify.url={receiver.url}", "notify.timeout_s=60")
    exited = time.monotonic()
    bodies = receiver.wait_for(2)
    return bodies, exited - receiver.arrived[1]


def test_a_webhook_that_never_answers_delays_leaving_by_at_most_the_grace(tmp_path):
    """Leaving waits at most LEAVE_GRACE_S for posts not yet sent, never for an answer (it
    would take 60 s here). Measured from the post's arrival to the exit, against the same for a
    webhook that answers at once: the rest of the run's time, noisy on a loaded machine, is
    left out of the comparison."""
    with Receiver() as answering:
        _, prompt = leaving_after_completed(tmp_path / "answered", answering)
    with Receiver(answer=False) as silent:
        bodies, waited = leaving_after_completed(tmp_path / "unanswered", silent)
    print(f"2 ranks: exit {prompt:.2f} s after the completed post arrived when answered, "
          f"{waited:.2f} s when never answered")  # fmt: skip
    # rank 0 alone posted, each event once; both left before the ranks did
    assert [(b["event"], b["job"], b["step"]) for b in bodies] == [
        ("started", "local", 0),
        ("completed", "local", 2),
    ]
    assert waited < prompt + poster.LEAVE_GRACE_S


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
