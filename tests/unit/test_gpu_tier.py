"""The GPU tier runs alone and on the GPUs; every other tier runs on CPU even on a GPU machine,
and rows that need more GPUs than a node has are named, not skipped (`tests.fixtures.gpu_tier`)."""

import pytest

from tests.fixtures import gpu_tier
from tests.fixtures.helpers import REPO


@pytest.mark.parametrize(
    "args, named",
    [
        (["tests/gpu"], True),
        (["tests/gpu/"], True),
        (["tests/gpu/test_one_gpu.py::test_flight_recorder_dump_format"], True),
        ([str(REPO / "tests/gpu/test_two_gpus.py")], True),
        (["-k", "nccl", "tests/gpu"], True),
        (["tests"], False),  # the whole suite: the GPU tier is not asked for by name
        (["tests/unit", "tests/local"], False),
        (["tests/unit/test_gpu_binding.py"], False),
        ([], False),
    ],
)
def test_only_a_run_that_names_the_gpu_tier_keeps_the_gpus(monkeypatch, args, named):
    monkeypatch.chdir(REPO)
    environ = {"CUDA_VISIBLE_DEVICES": "0"}
    assert gpu_tier.hide_gpus_unless_asked(args, REPO, environ) is not named
    assert environ["CUDA_VISIBLE_DEVICES"] == ("0" if named else "")


def test_rows_that_need_more_gpus_than_the_node_has_are_named():
    needs = {"a": 1, "b": 2, "c": 1, "d": 4}
    assert gpu_tier.needing_more_gpus(needs, 1) == ["b", "d"]
    assert gpu_tier.needing_more_gpus(needs, 2) == ["d"]
    assert gpu_tier.needing_more_gpus(needs, 8) == []


def test_this_run_sees_no_gpu():
    import os

    assert os.environ.get("CUDA_VISIBLE_DEVICES") == ""  # set by tests/conftest.py
