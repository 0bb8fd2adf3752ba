"""The NaN/inf guard's pieces and the stop vote's cadence, in one process."""

import itertools
import math

import pytest
import torch
from torch import nn

from hpcddp.config import TrainConfig
from hpcddp.outcome import StopReason
from hpcddp.train import guard, preemption
from hpcddp.train.state import Progress


def make_guard(**train):
    return guard.Guard(TrainConfig(**train), "cpu", scaled=False)


def model_and_probe():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    g = make_guard()
    with g.find_probe(model):
        model(torch.randn(2, 4)).sum().backward()
    return model, g


def test_the_probe_is_the_parameter_nearest_the_loss():
    model, g = model_and_probe()
    assert g.probe is model[2].bias or g.probe is model[2].weight


def test_a_finite_loss_is_seeded_by_exactly_one():
    g = make_guard()
    loss = torch.tensor(0.123456789, requires_grad=True)
    seeded = g.seeded(loss)
    assert seeded.item() == loss.item()
    seeded.backward()
    assert loss.grad.item() == 1.0


def test_a_nan_loss_poisons_every_gradient_it_reaches():
    model, g = model_and_probe()
    model.zero_grad()
    x = torch.randn(5, 4)
    loss = model(x).sum() + float("nan")  # NaN that would not reach the gradients by itself
    g.seeded(loss).backward()
    params = list(model.parameters())
    assert torch.isnan(model[2].weight.grad).all()
    assert g.look(params, None, 1)[0]
    model.zero_grad()
    g.seeded(model(x).sum()).backward()
    assert not g.look(params, None, 1)[0]


def test_grad_norm_option_catches_an_inf_gradient_under_a_finite_loss():
    model, g = model_and_probe()
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    params[0].grad[0, 0] = math.inf  # far from the probe
    assert not g.look(params, None, 1)[0]
    assert make_guard(nonfinite_grad_norm=True).look(params, None, 1)[0]
    assert g.look(params, torch.tensor(math.inf), 1)[0]  # a norm computed for clipping is used


def test_off_checks_nothing():
    g = make_guard(nonfinite="off")
    loss = torch.tensor(math.nan)
    assert g.seeded(loss) is loss and not g.look([], None, 1)[0]


@pytest.mark.parametrize(
    "ranks, policy, expected",
    [
        ([1], "stop", "at step 7 in the loss first on rank 1;"),
        ([0, 3], "stop", "first on rank 0 (also ranks [3]);"),
        ([], "stop", "in the gradients (the loss was finite on every rank)"),
        ([2], "skip", "rank 2, after 11 skipped steps (train.nonfinite_max_skips)"),
    ],
)
def test_the_message_names_step_rank_and_what_was_kept(ranks, policy, expected):
    text = guard.message(7, ranks, 11, 5, policy)
    assert expected in text and "checkpoint step 5 is the latest" in text
    assert "\n" not in text and "HINT: " in text


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_vote_is_held_about_every_half_second(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(preemption.time, "perf_counter", clock)
    vote = preemption.StopVote("gloo", distributed=False)
    held = []
    for step in range(1, 400):
        clock.now += 0.01  # 10 ms a step: a vote every 50 steps
        if vote.pending:
            assert vote.result() is None
        if vote.due(step):
            vote.cast(None, step)
            held.append(step)
    assert held[:3] == [1, 51, 101] and all(b - a == 50 for a, b in itertools.pairwise(held))


def test_after_a_pause_every_rank_took_the_next_step_votes(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(preemption.time, "perf_counter", clock)
    vote = preemption.StopVote("gloo", distributed=False)
    clock.now += 0.01
    vote.cast(None, 1)
    clock.now += 5.0  # a checkpoint right after the vote
    vote.restart(1)
    clock.now += 0.01
    vote.result()
    assert vote.due(2)
    vote.cast(None, 2)
    clock.now += 0.01
    vote.result()
    assert vote.next_step == 52  # the pause did not count as a slow step


def test_a_slow_step_votes_every_step_and_the_reason_comes_back(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(preemption.time, "perf_counter", clock)
    vote = preemption.StopVote("gloo", distributed=False)
    clock.now += 2.0
    vote.cast(StopReason.PREEMPTED, 1)
    assert vote.result() == StopReason.PREEMPTED
    assert vote.due(2)
    assert vote.result() is None  # nothing pending: nothing to read


# -- the one-step-late (CUDA) path, with the device copy faked -----------------------------------


class HeldCopy(guard.Late):
    """What `guard.PinnedCopy` does on CUDA, on the CPU: the flags, read later."""

    def __init__(self, flags: torch.Tensor, step: int) -> None:
        self.flags, self.step = flags.clone(), step

    def read(self) -> guard.Seen:
        return guard._seen(self.flags.tolist(), self.step)


def lagged_guard(**train) -> guard.Guard:
    g = guard.Guard(TrainConfig(**train), "cuda", scaled=False, late_copy=HeldCopy)
    assert g.lagged
    return g


def test_the_late_path_names_the_bad_step_and_whether_this_rank_saw_it():
    model, _ = model_and_probe()
    g = lagged_guard()
    g.find_probe(model).__enter__()
    params, x = list(model.parameters()), torch.randn(5, 4)
    progress = Progress(step=0)
    found = []
    for step, bad in [(1, False), (2, True), (3, False)]:
        model.zero_grad()
        loss = model(x).sum() + (float("nan") if bad else 0.0)
        g.seeded(loss).backward()
        skip, seen = g.look(params, None, step)
        assert not skip  # the late path never holds the optimizer back
        found.append(seen)
        progress.step = step
        if g.judge(seen, progress):
            break
    assert found[0] is None and found[1] == guard.Seen(1, nonfinite=False, own_loss=False)
    assert found[2] == guard.Seen(2, nonfinite=True, own_loss=True)  # step 2, read at step 3
    assert g.stopped is not None and g.stopped.step == 2 and progress.skipped_steps == 1


def test_settle_reads_the_last_step_before_a_checkpoint():
    model, _ = model_and_probe()
    g = lagged_guard()
    g.find_probe(model).__enter__()
    g.seeded(model(torch.randn(5, 4)).sum() * float("inf")).backward()
    assert g.look(list(model.parameters()), None, 7) == (False, None)
    assert g.settle() == guard.Seen(7, nonfinite=True, own_loss=True)
    assert g.settle() is None


# -- fp16: GradScaler's overflows are not non-finite steps --------------------------------------


def scaled_guard(**train) -> guard.Guard:
    return guard.Guard(TrainConfig(**train), "cpu", scaled=True)


def test_an_overflow_with_a_finite_loss_is_counted_never_a_stop():
    g, progress = scaled_guard(nonfinite="stop"), Progress()
    for step in range(1, 6):
        g.seeded(torch.tensor(1.5))
        seen = g.look_scaled(torch.tensor(1.0), step)  # the scaler found inf/NaN gradients
        assert seen == guard.Seen(step, nonfinite=False, own_loss=False, overflow=True)
        assert not g.judge(seen, progress, lambda s=step: 2.0**16 / 2**s)
    assert (progress.overflow_steps, progress.skipped_steps) == (5, 0)


def test_a_nan_loss_under_fp16_is_non_finite_even_though_the_scaler_skips_it():
    g, progress = scaled_guard(nonfinite="stop"), Progress()
    g.seeded(torch.tensor(float("nan")))
    seen = g.look_scaled(torch.tensor(1.0), 4)
    assert seen == guard.Seen(4, nonfinite=True, own_loss=True, overflow=False)
    assert g.judge(seen, progress) and progress.overflow_steps == 0


def test_a_collapsing_scale_after_many_overflows_stops_the_run():
    g, progress = scaled_guard(nonfinite="stop"), Progress()
    scale = 2.0**16
    for step in range(1, 100):
        g.seeded(torch.tensor(1.0))
        scale /= 2
        if g.judge(g.look_scaled(torch.tensor(1.0), step), progress, lambda s=scale: s):
            break
    assert scale < guard.SCALE_FLOOR and step >= guard.OVERFLOW_RUN
    assert g.collapsed_scale == scale and g.stopped is not None and g.stopped.step == step
    text = guard.message(step, [], progress.skipped_steps, None, "stop", g.collapsed_scale)
    assert "fp16 loss scale fell to" in text and f"at step {step}" in text


def test_skip_stops_once_more_than_max_skips_were_skipped():
    """docs/models.md: `skip` stops once more than train.nonfinite_max_skips were skipped."""
    g, progress = scaled_guard(nonfinite="skip", nonfinite_max_skips=2), Progress()
    bad = [guard.Seen(step, nonfinite=True, own_loss=True) for step in (3, 5, 8)]
    assert [g.judge(seen, progress) for seen in bad] == [False, False, True]
    assert progress.skipped_steps == 3 and g.stopped == bad[2]


def test_a_scale_below_the_floor_stops_at_the_25th_overflow_in_a_row_only():
    """docs/models.md: a scale that falls below 2^-8 after 25 overflows in a row is a NaN stop;
    a clean step in between starts the count again, and a scale at 2^-8 is not below it."""
    below, at = lambda: 2.0**-9, lambda: 2.0**-8

    def overflows(g, progress, count, scale):
        seen = [guard.Seen(s, nonfinite=False, own_loss=False, overflow=True) for s in range(count)]
        return [g.judge(one, progress, scale) for one in seen]

    g, progress = scaled_guard(nonfinite="stop"), Progress()
    assert overflows(g, progress, 25, below) == [False] * 24 + [True]
    g, progress = scaled_guard(nonfinite="stop"), Progress()
    assert overflows(g, progress, 24, below) == [False] * 24
    assert not g.judge(guard.Seen(24, nonfinite=False, own_loss=False), progress)  # a clean step
    assert overflows(g, progress, 24, below) == [False] * 24
    g, progress = scaled_guard(nonfinite="stop"), Progress()
    assert overflows(g, progress, 40, at) == [False] * 40
