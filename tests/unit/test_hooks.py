"""A side concern attaches to the loop as a hook: it sees every moment, in order, and the loop
is not touched to add it (`hpcddp.train.hooks`)."""

import pytest

from hpcddp import Trainer
from hpcddp.config import load_config
from hpcddp.launch.resolve import resolve_env
from hpcddp.outcome import StopReason
from hpcddp.train.hooks import Hook, Hooks, Stepped
from tests.fixtures.helpers import QUICKSTART

RUN = [
    "data.kwargs={train_size: 256, eval_size: 64}",  # 4 steps per epoch of 64
    "train.max_steps=4",
    "train.log_every_steps=2",
    "train.eval_every_steps=2",
    "train.checkpoint_every_steps=4",
]


class Recording(Hook):
    """What a hook of the user's sees, as (moment, step) pairs."""

    def __init__(self, fail_at_step: int = 0) -> None:
        self.seen: list[tuple[str, object]] = []
        self.fail_at_step = fail_at_step

    def on_start(self, progress):
        self.seen.append(("start", progress.step))

    def on_step(self, stepped: Stepped):
        self.seen.append(("step", stepped.progress.step, stepped.logged))
        if stepped.progress.step == self.fail_at_step:
            raise RuntimeError(f"the hook broke at step {self.fail_at_step}")

    def on_pause(self, phase):
        self.seen.append(("pause", phase))

    def on_resume(self, phase, seconds):
        self.seen.append(("resume", phase))

    def on_evaluation(self, progress, metrics, record):
        self.seen.append(("evaluation", progress.step, sorted(metrics), record))

    def on_train_end(self, progress, reason):
        self.seen.append(("train_end", progress.step, reason))

    def on_stop(self, progress, reason):
        self.seen.append(("stop", progress.step, reason))

    def on_end(self, outcome):
        self.seen.append(("end", outcome.step, outcome.finished))

    def on_failure(self, err, step):
        self.seen.append(("failure", step, str(err)))

    def close(self):
        self.seen.append(("close",))


def fit(tmp_path, hook: Hook) -> None:
    config = load_config(QUICKSTART, [f"run.dir={tmp_path}", *RUN])
    Trainer(config=config, hooks=[hook]).fit(resolve_env({}))


def test_a_hook_of_the_users_sees_every_moment_of_a_run_in_order(tmp_path):
    hook = Recording()
    fit(tmp_path, hook)
    evaluated = ("evaluation", 2, ["eval_accuracy", "eval_loss"], True)
    assert hook.seen == [
        ("start", 0),
        ("step", 1, False),
        ("step", 2, True),
        ("pause", "evaluation"),
        ("resume", "evaluation"),
        evaluated,
        ("step", 3, False),
        ("step", 4, True),
        ("pause", "evaluation"),
        ("resume", "evaluation"),
        (*evaluated[:1], 4, *evaluated[2:]),
        ("pause", "checkpoint"),
        ("resume", "checkpoint"),
        ("train_end", 4, None),
        ("end", 4, True),
        ("close",),
    ]


def test_a_failure_is_told_to_the_hooks_and_the_run_still_raises(tmp_path):
    hook = Recording(fail_at_step=3)
    with pytest.raises(Exception, match="the hook broke at step 3"):
        fit(tmp_path, hook)
    stepped, (moment, step, said), closed = hook.seen[-3:]
    assert stepped == ("step", 3, False) and closed == ("close",)
    assert (moment, step) == ("failure", 3) and "the hook broke at step 3" in said
    assert not any(seen[0] in ("train_end", "end") for seen in hook.seen)


def test_a_stop_is_told_after_its_checkpoint_and_before_the_end(tmp_path):
    hook = Recording()
    config = load_config(QUICKSTART, [f"run.dir={tmp_path}", *RUN, "train.stop_after_steps=3"])
    Trainer(config=config, hooks=[hook]).fit(resolve_env({}))
    assert hook.seen[-7:] == [
        ("step", 3, True),  # a stop's step is logged
        ("pause", "checkpoint"),
        ("resume", "checkpoint"),
        ("train_end", 3, StopReason.REQUESTED),
        ("stop", 3, StopReason.REQUESTED),
        ("end", 3, False),
        ("close",),
    ]


def test_every_hook_is_closed_even_when_one_fails_to_close():
    class Closing(Hook):
        def __init__(self, fails: bool) -> None:
            self.fails, self.closed = fails, False

        def close(self):
            self.closed = True
            if self.fails:
                raise OSError("the disk went away")

    first, second = Closing(fails=True), Closing(fails=False)
    with pytest.raises(OSError, match="the disk went away"):
        Hooks([first, second]).close()
    assert first.closed and second.closed
