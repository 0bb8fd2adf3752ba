"""dist.strategy=fsdp builds a model on the meta device: a rank never holds the whole model.

One 2-rank run of a 200 MB model that initialises itself (``init_weights``, so
``dist.fsdp_meta_init=auto`` builds it on meta) and measures its own build
(`tests.fixtures.meta_built`). Built whole, each rank's resident memory grows by the whole
model and then some (measured 262 MB); on meta by its shards (100 MB) and the sharding's own
overhead (measured 143-155 MB).
"""

import json

from tests.fixtures import meta_built
from tests.fixtures.helpers import run_cli


def test_each_rank_builds_only_its_shards_and_trains(tmp_path):
    peaks = tmp_path / "peaks"
    peaks.mkdir()
    result = run_cli(
        "train",
        "tests/fixtures/meta_built.yaml",
        f"run.dir={tmp_path / 'run'}",
        "--nproc",
        "2",
        env={"BUILD_PEAK_DIR": str(peaks)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads(f.read_text()) for f in sorted(peaks.glob("peak-*.txt"))]
    assert len(ranks) == 2
    whole = meta_built.param_bytes()
    for rank in ranks:
        assert rank["grown"] < whole, f"a rank grew {rank['grown'] / 1e6:.0f} MB building it"
    assert "built on the meta device" in result.stderr
    # each rank initialised a shard of its own, not a copy of rank 0's
    assert ranks[0]["first"] != ranks[1]["first"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 1
