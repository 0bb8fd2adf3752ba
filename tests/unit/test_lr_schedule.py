"""`lr_factor`: the learning-rate schedule the docs promise, checked point by point.

``optim.warmup_steps`` of linear warmup from 0 to lr, then a cosine from lr down to
``optim.min_lr_ratio`` of it (``optim.schedule=constant``: lr after the warmup). The cosine
reaches its floor where the step after the run's last would be, as ``transformers``' cosine
schedule does. ``lr_factor(i, ...)`` is the fraction of lr that the (i+1)-th optimizer step uses
(LambdaLR counts from 0); the expected values are written by hand, not by a copy of the formula.
"""

import pytest

from hpcddp.config import OptimConfig
from hpcddp.train.optim import lr_factor


def factors(total: int, **optim) -> list[float]:
    cfg = OptimConfig(**optim)
    return [lr_factor(i, cfg, total) for i in range(total)]


def test_warmup_climbs_linearly_to_the_full_rate():
    assert factors(4, warmup_steps=4, schedule="constant") == [0.25, 0.5, 0.75, 1.0]


def test_cosine_falls_from_the_full_rate_and_reaches_the_floor_at_the_planned_end():
    # 4 steps, no warmup: the cosine at 0, 1/4, 1/2 and 3/4 of its way; all of it (the floor,
    # 0.1) is where a 5th step would be.
    assert factors(4, schedule="cosine", min_lr_ratio=0.1) == pytest.approx(
        [1.0, 0.1 + 0.9 * (2 + 2**0.5) / 4, 0.55, 0.1 + 0.9 * (2 - 2**0.5) / 4]
    )
    assert lr_factor(4, OptimConfig(schedule="cosine", min_lr_ratio=0.1), 4) == pytest.approx(0.1)


def test_warmup_then_cosine_joins_at_the_peak():
    got = factors(6, warmup_steps=2, schedule="cosine", min_lr_ratio=0.0)
    assert got == pytest.approx([0.5, 1.0, 1.0, (2 + 2**0.5) / 4, 0.5, (2 - 2**0.5) / 4])


def test_the_floor_holds_past_the_planned_end():
    cfg = OptimConfig(schedule="cosine", min_lr_ratio=0.2)
    assert lr_factor(50, cfg, 10) == pytest.approx(0.2)


def test_constant_after_warmup_stays_at_the_full_rate():
    assert factors(6, warmup_steps=2, schedule="constant") == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
