"""The launch environments users actually end up with, each answered in one line or rightly.

Every case below is an environment seen in the wild (USER-PAIN.md 1, 5, 6): half of torchrun's
variables left in a shell, submitit's local executor inside an srun step, an exported
``MASTER_ADDR=localhost``, a wrapper that sets RANK/WORLD_SIZE only, ``--distribution=arbitrary``,
left-over ``HPCDDP_LOCAL_*`` variables. Resolution reads a plain dict, so each is exact.
"""

import pytest

from hpcddp.errors import LaunchError
from hpcddp.launch.resolve import place, resolve_env

LAUNCHER_PID = 4321  # a local launcher that is this process's ancestor


def resolve(environ, gpus=0):
    return resolve_env(
        environ, cuda_devices=lambda: gpus, hostname="here", ancestors=lambda: [LAUNCHER_PID, 1]
    )


def step(procid, nodeid, localid, **extra):
    """Task ``procid`` of `srun -N2 --ntasks-per-node=2` on n[1-2] (block distribution)."""
    return {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_LOCALID": str(localid),
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        **extra,
    }


# -- half a launcher's variables ------------------------------------------------------------


@pytest.mark.parametrize(
    "environ, names",
    [
        ({"LOCAL_RANK": "1"}, "LOCAL_RANK=1"),
        ({"NODE_RANK": "1"}, "NODE_RANK=1"),
        ({"WORLD_SIZE": "4"}, "WORLD_SIZE=4"),
        ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}, "LOCAL_WORLD_SIZE=8"),
        ({"GROUP_RANK": "2", "WORLD_SIZE": "16"}, "WORLD_SIZE=16 GROUP_RANK=2"),
    ],
)
def test_partial_launcher_environment_is_refused_not_rank_zero_of_one(environ, names):
    with pytest.raises(LaunchError) as err:
        resolve(environ)
    message = str(err.value)
    assert names in message and "would train alone as rank 0 of 1" in message
    assert "HINT: unset" in message and "\n" not in message


@pytest.mark.parametrize(
    "environ", [{"LOCAL_RANK": "0"}, {"WORLD_SIZE": "1"}, {"NODE_RANK": "0", "RANK": "0"}]
)
def test_values_that_say_one_process_are_no_claim(environ):
    assert resolve(environ).world_size == 1


# -- submitit's local executor inside srun ----------------------------------------------------


def submitit_local(rank, ntasks="2"):
    return {
        "SUBMITIT_LOCAL_GLOBALID": str(rank),
        "SUBMITIT_LOCAL_LOCALID": str(rank),
        "SUBMITIT_LOCAL_NTASKS": ntasks,
        "SUBMITIT_LOCAL_JOB_ID": str(LAUNCHER_PID),
    }


def test_submitit_local_inside_a_many_task_step_is_refused_not_all_rank_zero():
    for rank in (0, 1):
        with pytest.raises(LaunchError, match=r"runs inside task 0 of an srun step of 4 tasks"):
            resolve({**step(0, 0, 0), **submitit_local(rank)})


def test_submitit_local_inside_a_one_task_step_numbers_its_own_world():
    one_task = step(0, 0, 0, SLURM_STEP_NUM_TASKS="1", SLURM_STEP_TASKS_PER_NODE="1")
    envs = [resolve({**one_task, **submitit_local(rank)}) for rank in (0, 1)]
    assert [(e.launcher, e.rank, e.world_size) for e in envs] == [("local", 0, 2), ("local", 1, 2)]


# -- MASTER_ADDR=localhost left in a shell -----------------------------------------------------


@pytest.mark.parametrize("addr", ["localhost", "127.0.0.1", "127.0.1.1", "::1"])
def test_loopback_master_in_a_multinode_step_is_refused_by_every_rank_alike(addr):
    messages = set()
    for procid, nodeid, localid in [(0, 0, 0), (3, 1, 1)]:
        with pytest.raises(LaunchError) as err:
            resolve(step(procid, nodeid, localid, MASTER_ADDR=addr))
        assert getattr(err.value, "agreed", False)  # rank 0 prints it, once
        messages.add(str(err.value))
    assert len(messages) == 1
    assert f"MASTER_ADDR={addr} but this job spans 2 nodes" in messages.pop()


def test_loopback_master_on_one_node_is_fine_and_torchrun_across_nodes_is_not():
    one_node = step(0, 0, 0, SLURM_STEP_NODELIST="n1", SLURM_STEP_TASKS_PER_NODE="4")
    assert resolve({**one_node, "MASTER_ADDR": "localhost"}).master_addr == "localhost"
    torchrun = {
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": "29500",
    }
    with pytest.raises(LaunchError, match="spans 2 nodes"):
        resolve(torchrun)


# -- a wrapper that sets RANK and WORLD_SIZE only ---------------------------------------------


def test_wrapper_copying_the_steps_numbers_is_the_step():
    mirrored = step(3, 1, 1, RANK="3", WORLD_SIZE="4")
    env = resolve(mirrored)
    assert (env.launcher, env.rank, env.local_rank, env.local_world_size) == ("slurm", 3, 1, 2)
    assert env.master_addr == "n1"


def test_wrapper_without_local_world_size_is_refused_without_blaming_torchrun():
    wrapper = {"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    with pytest.raises(LaunchError) as err:
        resolve(wrapper)
    message = str(err.value)
    assert "by a launcher that is not torchrun" in message
    assert "LOCAL_RANK or LOCAL_WORLD_SIZE" in message
    assert "export LOCAL_RANK and LOCAL_WORLD_SIZE in your wrapper" in message
    assert "launch with `torchrun" not in message
    real = {**wrapper, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert resolve(real).local_world_size == 2  # the full set is taken as it is


# -- srun --distribution=arbitrary ----------------------------------------------------------


def arbitrary(procid, nodeid, localid, hostfile):
    return step(
        procid, nodeid, localid, SLURM_DISTRIBUTION="arbitrary", SLURM_HOSTFILE=str(hostfile)
    )


def test_arbitrary_distribution_finds_rank_zero_in_the_hostfile_on_every_rank(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# rank 0 goes to the second node\nn2\nn1\nn1\nn2\n")
    layout = [(0, 1, 0), (1, 0, 0), (2, 0, 1), (3, 1, 1)]  # what srun did with that file
    envs = [resolve(arbitrary(p, n, local, hostfile)) for p, n, local in layout]
    assert {e.master_addr for e in envs} == {"n2"}
    assert envs[0].rank == 0


def test_arbitrary_distribution_without_a_readable_hostfile_is_refused_by_all(tmp_path):
    for procid, nodeid, localid in [(0, 1, 0), (1, 0, 0)]:
        with pytest.raises(LaunchError, match="cannot be read here") as err:
            resolve(arbitrary(procid, nodeid, localid, tmp_path / "missing"))
        assert getattr(err.value, "agreed", False)


# -- left-over HPCDDP_LOCAL_* variables ------------------------------------------------------

LEFTOVERS = {
    "HPCDDP_LOCAL_RANK": "1",
    "HPCDDP_LOCAL_WORLD_SIZE": "2",
    "HPCDDP_LOCAL_JOB_ID": "999",  # a launcher long gone
}


def test_leftover_local_variables_are_refused_instead_of_waiting_300_s():
    with pytest.raises(LaunchError) as err:
        resolve(LEFTOVERS)
    message = str(err.value)
    assert "its launcher, pid 999, did not start this process" in message
    assert "HINT: unset HPCDDP_LOCAL_JOB_ID HPCDDP_LOCAL_RANK HPCDDP_LOCAL_WORLD_SIZE" in message


def test_leftover_local_variables_do_not_fool_a_slurm_step():
    env = resolve({**step(2, 1, 0), **LEFTOVERS})
    assert (env.launcher, env.rank, env.world_size) == ("slurm", 2, 4)


def test_a_genuine_local_launch_is_recognised_by_its_launcher_pid():
    env = resolve({**LEFTOVERS, "HPCDDP_LOCAL_JOB_ID": str(LAUNCHER_PID)})
    assert (env.launcher, env.rank, env.world_size) == ("local", 1, 2)


# -- one rank's own refusal waits for the rendezvous, where everyone hears it ------------------


def test_a_device_refusal_keeps_the_place_so_the_others_can_be_told():
    env, refusal = place(step(2, 1, 0, HPCDDP_DEVICE="cuda"), cuda_devices=lambda: 0, hostname="n2")
    assert (env.rank, env.master_addr, env.hostname) == (2, "n1", "n2")
    assert isinstance(refusal, LaunchError) and "sees no GPU" in str(refusal)


def test_a_local_launch_takes_a_free_port_below_the_ephemeral_range(monkeypatch):
    """The port is free when chosen and nobody's until rank 0 binds it: one in the ephemeral
    range could meanwhile go to any outgoing connection (a suite run hit that)."""
    import random
    import socket

    from hpcddp.launch import local
    from hpcddp.launch.ports import EPHEMERAL_RANGE, PORT_BASE, PORT_SPAN

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        candidates = iter([taken, PORT_BASE + 7])  # the first is in use: it must be passed over
        monkeypatch.setattr(random, "randrange", lambda *_: next(candidates))
        assert local.free_port() == PORT_BASE + 7
    monkeypatch.undo()
    ports = {local.free_port() for _ in range(20)}
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN < EPHEMERAL_RANGE[0] for p in ports)


# -- the rank that died is the cause, even when a survivor's exit is seen first ----------------


def test_a_local_launch_names_the_rank_that_died_not_the_one_that_only_lost_it():
    """A survivor that only lost its peer (exit 76) can end before the rank that died; the
    launcher reports the death. The same rank exiting 1 first would be the cause itself."""
    import signal
    import subprocess
    import sys

    from hpcddp import exit_codes
    from hpcddp.launch import local

    def ranks(first_status: int) -> list[subprocess.Popen]:
        first = f"import sys; sys.exit({first_status})"
        dies = "import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)"
        return [subprocess.Popen([sys.executable, "-c", code]) for code in (first, dies)]

    assert local._wait(ranks(exit_codes.PEER_LOST), settle_s=10) == (1, -signal.SIGKILL)
    assert local._wait(ranks(exit_codes.FAILED), settle_s=10) == (0, exit_codes.FAILED)
