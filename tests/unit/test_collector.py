"""The collector paused for a rank's start-up is never left off (`hpcddp.launch.collector`).

A run that fails before its first step, in a process that goes on (submitit's, a test's), must
not leave that process without its garbage collector.
"""

import gc

import pytest

from hpcddp.launch import collector


@pytest.fixture(autouse=True)
def collector_restored():
    yield
    gc.enable()
    gc.unfreeze()


def test_a_start_up_that_fails_turns_the_collector_back_on():
    with pytest.raises(RuntimeError), collector.paused():
        assert not gc.isenabled()
        raise RuntimeError("failed before the first step")
    assert gc.isenabled()


def test_resume_collects_freezes_start_up_and_turns_the_collector_on():
    with collector.paused():
        gc.unfreeze()
        collector.resume()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
    assert gc.isenabled()
