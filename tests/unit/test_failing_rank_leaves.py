"""A rank that fails leaves at once: its group is aborted, never destroyed gracefully.

Emulated as NCCL behaves: destroying a group waits for its collectives, and one stuck on a
hung peer never ends, so a graceful destroy on the failure path holds the rank until NCCL's
watchdog kills it, and the error it was raising is never printed. Here `destroy_process_group`
waits as that stuck destroy would (bounded, so a regression fails instead of hanging).
"""

import threading
import time

import pytest
import torch.distributed as dist

from hpcddp.comm import group
from hpcddp.launch.distenv import DistEnv

STUCK_S = 8.0  # how long the emulated destroy waits for a collective that never ends


def alone():
    return DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 29500, "local", "", hostname="h")


@pytest.fixture
def destroy_waits_on_a_stuck_collective(monkeypatch):
    real, waited = dist.destroy_process_group, []
    never = threading.Event()

    def destroy(*args, **kwargs):
        waited.append(True)
        never.wait(STUCK_S)
        real(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", destroy)
    return waited, never


def test_a_failure_aborts_the_group_and_its_error_leaves_at_once(
    destroy_waits_on_a_stuck_collective,
):
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="NCCL communicator was aborted"), group.joined(alone()):
        raise RuntimeError("NCCL communicator was aborted on rank 0")  # as a peer's abort reads
    assert time.monotonic() - started < STUCK_S / 4
    assert not dist.is_initialized() and destroy_waits_on_a_stuck_collective[0] == []


def test_a_finished_run_still_leaves_gracefully(destroy_waits_on_a_stuck_collective):
    waited, collectives_done = destroy_waits_on_a_stuck_collective
    collectives_done.set()  # a finished run has nothing in flight: its destroy returns
    with group.joined(alone()):
        pass
    assert waited == [True] and not dist.is_initialized()
