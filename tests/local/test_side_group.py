"""One gloo side group per run, however many parts of it need one (hpcddp.comm.sidegroup)."""

import pytest

from tests.fixtures.helpers import TINY, train_local


@pytest.mark.slow
def test_a_run_with_telemetry_and_checkpoints_creates_one_side_group_per_rank(tmp_path):
    counts = tmp_path / "counts"
    counts.mkdir()
    train_local(
        tmp_path / "run",
        *TINY,
        "train.max_steps=4",
        "train.checkpoint_every_steps=2",  # waits for rank 0's writes
        "train.log_every_steps=1",  # every rank's telemetry gathered
        "model.factory=tests.fixtures.counted_groups:make_model",
        f"model.kwargs={{out: {counts}}}",
    )
    made = sorted(int(p.read_text()) for p in counts.glob("groups-*.txt"))
    assert made == [1, 1]  # one extra mesh per rank: not one per user of a side group
