"""A backend that cannot connect ranks which met: NCCL's own reason kept (its ``Last error:``
lines, not only the first), and a hint for that backend and cause, not a firewall for all."""

import dataclasses

import pytest

from hpcddp.comm import group, join_errors
from hpcddp.comm.rendezvous import Meeting, Network
from hpcddp.launch.distenv import DistEnv

# NCCL's errors as torch raises them from init_process_group(device_id=...): a first line that
# only names the file and the class of error, NCCL's own reason after "Last error:".
HEAD = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, {kind}, "
    "NCCL version 2.27.5\n{code}: {meaning}\nLast error:\n{last}"
)
DUPLICATE = HEAD.format(
    kind="invalid usage (run with NCCL_DEBUG=WARN for details)",
    code="ncclInvalidUsage",
    meaning="This usually reflects invalid usage of NCCL library.",
    last="Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 3b000",
)
IB = HEAD.format(
    kind="unhandled system error (run with NCCL_DEBUG=INFO for details)",
    code="ncclSystemError",
    meaning="System call (e.g. socket, malloc) or external library call failed or device error.",
    last="Call to ibv_create_qp failed with error Cannot allocate memory",
)
SOCKET = HEAD.format(
    kind="remote process exited or there was a network error",
    code="ncclRemoteError",
    meaning="A call failed possibly due to a network error or a remote process exiting.",
    last="socketStartConnect: Connect to 10.0.0.12<43271> failed : Connection timed out",
)
CUDA = HEAD.format(
    kind="unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    code="ncclUnhandledCudaError",
    meaning="Call to CUDA function failed.",
    last="Cuda failure 2 'out of memory'",
)
UNKNOWN = HEAD.format(
    kind="internal error", code="ncclInternalError", meaning="Internal check failed.", last="x"
)
GLOO = "Gloo connectFullMesh failed with ... SO_ERROR: Connection refused, remote=[n2]:4312"


def nccl_rank(rank=1, world=2):
    env = DistEnv(rank, rank, world, world, 0, 1, "10.0.0.11", 29500, "slurm", "", hostname="n1")
    return dataclasses.replace(env, backend="nccl", device=f"cuda:{rank}")


MEETING = Meeting(Network("ib0", "10.0.0.12", "route to the master", "10.0.0.11"), {})


@pytest.mark.parametrize(
    ("text", "reason", "hint"),
    [
        (DUPLICATE, "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 3b000",
         "two ranks of this job are on one GPU (MIG instances of one GPU count as one"),
        (IB, "Call to ibv_create_qp failed", "NCCL's InfiniBand transport failed on that node"),
        (SOCKET, "socketStartConnect: Connect to 10.0.0.12<43271> failed",
         "NCCL's sockets could not connect the nodes"),
        (CUDA, "Cuda failure 2 'out of memory'", "a CUDA call inside NCCL failed"),
        (UNKNOWN, "Last error: x", "rerun with NCCL_DEBUG=WARN"),
    ],
)  # fmt: skip
def test_nccl_s_reason_is_kept_with_the_hint_for_its_cause(text, reason, hint):
    message = str(group._join_error(nccl_rank(), MEETING, RuntimeError(text), 300))
    assert message.startswith(
        "rank 1 on n1 met the others but nccl could not connect them over ib0 (10.0.0.12) "
        "within 300 s: NCCL error in: /pytorch/"
    )
    said, told = message.split(" HINT: ")
    assert reason in said, said
    assert told.startswith(hint), told
    assert "firewall" not in message  # no NCCL cause here is a firewall between nodes


def test_gloo_keeps_the_network_hint_and_one_line_error():
    env = dataclasses.replace(nccl_rank(), backend="gloo", device="cpu")
    message = str(group._join_error(env, MEETING, RuntimeError(GLOO + "\nframe 1\nframe 2"), 60))
    assert f"within 60 s: {GLOO}. HINT: the nodes must reach each other" in message
    assert "frame 1" not in message


def test_nccl_s_reason_is_taken_from_its_last_error_lines_not_the_file_name():
    # the first line names ProcessGroupNCCL.cpp and "system error": neither decides the cause
    assert join_errors.cause_of("nccl", IB).name == "InfiniBand"
    assert join_errors.cause_of("nccl", DUPLICATE).name == "duplicate GPU"
    assert join_errors.cause_of("gloo", DUPLICATE) is None
    assert join_errors.reason("") == "" and join_errors.reason("one\n") == "one"


def test_a_timed_out_nccl_collective_names_the_missing_ranks_through_the_gloo_side_group(
    monkeypatch,
):
    """NCCL has no monitored barrier: the gloo side group the run already made has one."""
    from hpcddp.comm import failures, sidegroup

    side = object()
    asked = []

    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        asked.append(group)
        if group is not side:  # the default group is NCCL's
            raise RuntimeError("monitored_barrier is only implemented for GLOO backend.")
        raise RuntimeError("[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 10000 ms")

    monkeypatch.setattr(failures.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(failures.dist, "monitored_barrier", monitored_barrier)
    monkeypatch.setattr(sidegroup, "made", lambda: side)
    timeout = RuntimeError("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)")
    told = str(failures.explain(timeout, nccl_rank(0, 4), 600))
    assert "never reached: Ranks 1, 3 failed to pass monitoredBarrier" in told, told
    assert asked == [side]
    monkeypatch.setattr(sidegroup, "made", lambda: None)  # never made: not made now either
    told = str(failures.explain(timeout, nccl_rank(0, 4), 600))
    assert "never reached. A rank" in told and asked == [side]
