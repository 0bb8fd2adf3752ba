"""resolve_env on plain dicts: one row per launch context, one per way launch info goes wrong."""

import dataclasses

import pytest

from hpcddp.errors import LaunchError
from hpcddp.launch.contexts import parse_tasks_per_node
from hpcddp.launch.ports import EPHEMERAL_RANGE, derive_port
from hpcddp.launch.resolve import choose_device, resolve_env

NO_GPU = lambda: 0  # noqa: E731


LAUNCHERS = [77, 991]  # the pids of the local launchers below, as this process's ancestors
OUR_LAUNCHER = {"HPCDDP_LOCAL_JOB_ID": "77"}


def resolve(environ, gpus=0):
    return resolve_env(
        environ, cuda_devices=lambda: gpus, hostname="testhost", ancestors=lambda: LAUNCHERS
    )


def slurm_step(procid, localid, nodeid, **extra):
    """A task of `srun -N3 -n7` with uneven placement 3,2,2 on rack[1-2]-node[01-02]'s first 3."""
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_STEP_NUM_TASKS": "7",
        "SLURM_STEP_NUM_NODES": "3",
        "SLURM_STEP_NODELIST": "rack1-node[01-02],rack2-node01",
        "SLURM_STEP_TASKS_PER_NODE": "3,2(x2)",
        # job-level values differ from the step's on purpose: the step must win
        "SLURM_NTASKS": "16",
        "SLURM_JOB_NODELIST": "rack[1-2]-node[01-04]",
        "SLURM_TASKS_PER_NODE": "2(x8)",
    }
    env.update(extra)
    return env


def test_slurm_step_uses_step_scoped_values():
    env = resolve(slurm_step(procid=4, localid=1, nodeid=1))
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (4, 1, 7, 2)
    assert (env.node_rank, env.num_nodes, env.launcher, env.job_id) == (1, 3, "slurm", "4242")
    assert env.master_addr == "rack1-node01"  # first host of the step, never localhost
    assert env.master_port == derive_port("4242", "0", "")
    assert (env.device, env.backend, env.hostname) == ("cpu", "gloo", "testhost")


def test_every_rank_of_a_step_agrees_on_master_and_world():
    layout = [(0, 0, 0), (1, 1, 0), (2, 2, 0), (3, 0, 1), (4, 1, 1), (5, 0, 2), (6, 1, 2)]
    envs = [resolve(slurm_step(p, local, n)) for p, local, n in layout]
    assert {(e.master_addr, e.master_port, e.world_size) for e in envs} == {
        ("rack1-node01", derive_port("4242", "0"), 7)
    }
    assert [e.local_world_size for e in envs] == [3, 3, 3, 2, 2, 2, 2]


def test_torchrun_wins_inside_slurm_step():
    environ = slurm_step(
        0,
        0,
        0,
        RANK="5",
        LOCAL_RANK="1",
        WORLD_SIZE="8",
        LOCAL_WORLD_SIZE="4",
        GROUP_RANK="1",
        MASTER_ADDR="rack1-node02",
        MASTER_PORT="29400",
        TORCHELASTIC_RUN_ID="4242",
    )
    env = resolve(environ)
    assert (env.launcher, env.rank, env.local_rank, env.world_size) == ("torchrun", 5, 1, 8)
    assert (env.node_rank, env.num_nodes, env.master_port) == (1, 2, 29400)
    assert env.job_id == "4242"


def test_explicit_master_wins_in_slurm():
    env = resolve(slurm_step(0, 0, 0, MASTER_ADDR="10.0.0.5", MASTER_PORT="23456"))
    assert (env.master_addr, env.master_port) == ("10.0.0.5", 23456)


def test_local_launch_and_submitit_local():
    ours = resolve(
        {
            "HPCDDP_LOCAL_RANK": "1",
            "HPCDDP_LOCAL_WORLD_SIZE": "2",
            "HPCDDP_LOCAL_JOB_ID": "77",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "20001",
        }
    )
    assert (ours.launcher, ours.rank, ours.world_size, ours.master_port) == ("local", 1, 2, 20001)
    submitit = resolve(
        {
            "SUBMITIT_LOCAL_GLOBALID": "2",
            "SUBMITIT_LOCAL_NTASKS": "3",
            "SUBMITIT_LOCAL_JOB_ID": "991",
        }
    )
    assert (submitit.launcher, submitit.rank, submitit.local_rank, submitit.world_size) == (
        "local",
        2,
        2,
        3,
    )
    assert submitit.master_port == derive_port("991")


def test_plain_process_and_one_task_batch_shell_are_single():
    assert resolve({}).launcher == "single"
    env = resolve({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"})
    assert (env.launcher, env.world_size, env.job_id) == ("single", 1, "9")


def test_batch_shell_of_many_tasks_is_not_a_rank():
    with pytest.raises(LaunchError, match=r"SLURM_NTASKS=4 but no job step.*HINT: .*srun"):
        resolve({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SLURM_PROCID": None}, None),  # no PROCID: not a step task (falls to single -> NTASKS=16)
        ({"SLURM_STEP_NUM_TASKS": None}, "SLURM_STEP_NUM_TASKS is not set"),
        ({"SLURM_STEP_NODELIST": None}, "SLURM_STEP_NODELIST is not set"),
        ({"SLURM_LOCALID": "x"}, "SLURM_LOCALID='x' is not an integer"),
        ({"SLURM_PROCID": "7"}, r"rank 7 is not in \[0, 7\)"),
        ({"SLURM_STEP_TASKS_PER_NODE": "3,2"}, "lists 2 nodes but SLURM_STEP_NODELIST has 3"),
        ({"SLURM_STEP_TASKS_PER_NODE": "3,3,2"}, "adds up to 8 tasks but SLURM_STEP_NUM_TASKS=7"),
        ({"SLURM_STEP_TASKS_PER_NODE": "3,2(x2"}, "bad part"),
        ({"SLURM_NODEID": "3"}, "SLURM_NODEID=3 is not below"),
        ({"SLURM_LOCALID": "3"}, r"local rank 3 is not in \[0, 3\)"),
        ({"SLURM_STEP_NODELIST": "rack[2-1]"}, "SLURM_STEP_NODELIST"),
        ({"MASTER_PORT": "99999"}, "not a TCP port"),
    ],
)
def test_inconsistent_slurm_step_is_refused(change, message):
    environ = slurm_step(0, 0, 0)
    for key, value in change.items():
        if value is None:
            environ.pop(key)
        else:
            environ[key] = value
    with pytest.raises(LaunchError, match=message or "HINT"):
        resolve(environ)


@pytest.mark.parametrize(
    "environ, message",
    [
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
            "MASTER_ADDR and MASTER_PORT must both be set",
        ),
        (
            {
                "RANK": "2",
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "h",
                "MASTER_PORT": "29500",
            },
            r"rank 2 is not in \[0, 2\)",
        ),
        (
            {
                "RANK": "0",
                "WORLD_SIZE": "two",
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "h",
                "MASTER_PORT": "29500",
            },
            "WORLD_SIZE='two' is not an integer",
        ),
        ({"TORCHELASTIC_RUN_ID": "x"}, "RANK is not set"),
        (
            {"HPCDDP_LOCAL_RANK": "0", "HPCDDP_LOCAL_JOB_ID": "77"},
            "HPCDDP_LOCAL_WORLD_SIZE is not set",
        ),
        ({"HPCDDP_BACKEND": "mpi"}, "HPCDDP_BACKEND='mpi' is not one of"),
    ],
)
def test_bad_launch_information_is_refused(environ, message):
    with pytest.raises(LaunchError, match=message):
        resolve(environ)


def test_launch_errors_are_value_errors_with_a_hint():
    with pytest.raises(ValueError) as info:
        resolve({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "2"})
    assert "HINT:" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "text, counts",
    [
        ("2", [2]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("1(x2)", [1, 1]),
        ("3,2", [3, 2]),
        ("4(x1),2(x2)", [4, 2, 2]),
    ],
)
def test_tasks_per_node_forms(text, counts):
    assert parse_tasks_per_node(text) == counts


@pytest.mark.parametrize(
    "local_rank, visible, device",
    [
        (0, 0, "cpu"),
        (3, 0, "cpu"),
        (3, 1, "cuda:0"),  # Slurm bound one GPU to this task: it is always cuda:0
        (0, 4, "cuda:0"),
        (3, 4, "cuda:3"),
        (5, 4, "cuda:1"),  # whole node visible: local_rank % n
        (1, 2, "cuda:1"),
    ],
)
def test_device_choice(local_rank, visible, device):
    assert choose_device(local_rank, visible) == device


def test_cuda_means_nccl_and_both_are_overridable():
    env = resolve(slurm_step(4, 1, 1), gpus=2)
    assert (env.device, env.backend) == ("cuda:1", "nccl")
    env = resolve(slurm_step(4, 1, 1, SLURM_STEP_GPUS="3"), gpus=1)
    assert env.device == "cuda:0"
    forced = resolve(slurm_step(4, 1, 1, HPCDDP_DEVICE="cpu"), gpus=2)
    assert (forced.device, forced.backend) == ("cpu", "gloo")
    gloo_on_gpu = resolve(slurm_step(4, 1, 1, HPCDDP_BACKEND="gloo"), gpus=2)
    assert (gloo_on_gpu.device, gloo_on_gpu.backend) == ("cuda:1", "gloo")


def test_resolution_never_touches_cuda_visible_devices():
    environ = slurm_step(4, 1, 1, CUDA_VISIBLE_DEVICES="2,3")  # node 1: 2 ranks, 2 GPUs
    before = dict(environ)
    resolve(environ, gpus=2)
    assert environ == before


def test_dist_env_is_frozen_and_exports_torch_names():
    env = resolve(slurm_step(4, 1, 1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.rank = 0
    assert env.torch_env() == {
        "RANK": "4",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "7",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "rack1-node01",
        "MASTER_PORT": str(env.master_port),
    }


def test_ports_are_deterministic_distinct_per_step_and_outside_ephemeral_range():
    assert derive_port("123", "0") == derive_port("123", "0")
    for job in range(1000, 1300):
        ports = {derive_port(str(job), str(step), "") for step in range(8)}
        assert len(ports) == 8
        assert all(p < EPHEMERAL_RANGE[0] and p >= 1024 for p in ports)
    assert derive_port("55", "0", "1") != derive_port("55", "0", "2")


def test_rank_zero_off_the_first_host_needs_an_explicit_master():
    # --distribution=arbitrary / SLURM_HOSTFILE: rank 0 placed on the step's second node
    with pytest.raises(
        LaunchError,
        match=r"rank 0 runs on node 1 \(rack1-node02\).*HINT: "
        r".*block.*MASTER_ADDR=<host of rank 0>",
    ):
        resolve(slurm_step(0, 0, 1))
    env = resolve(slurm_step(0, 0, 1, MASTER_ADDR="rack1-node02"))
    assert (env.rank, env.master_addr) == (0, "rack1-node02")


def test_malformed_group_rank_is_explained():
    environ = {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29400",
    }
    assert resolve(environ).node_rank == 0  # no GROUP_RANK: derived from the rank
    with pytest.raises(LaunchError, match=r"torchrun: GROUP_RANK='one' is not an integer\. HINT"):
        resolve({**environ, "GROUP_RANK": "one"})


def test_bare_cuda_device_chooses_the_index_as_usual():
    assert resolve(slurm_step(4, 1, 1, HPCDDP_DEVICE="cuda"), gpus=2).device == "cuda:1"
    assert resolve(slurm_step(4, 1, 1, HPCDDP_DEVICE="cuda:0"), gpus=2).device == "cuda:0"
    with pytest.raises(LaunchError, match="HPCDDP_DEVICE=cuda but this process sees no GPU"):
        resolve(slurm_step(4, 1, 1, HPCDDP_DEVICE="cuda"), gpus=0)


def torchrun_rank(local_rank, local_world, **extra):
    return {
        "RANK": str(local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": str(local_world),
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29400",
        **extra,
    }


@pytest.mark.parametrize(
    "environ, gpus",
    [
        (torchrun_rank(3, 4), 2),  # torchrun: a node's ranks see the same GPUs
        (
            {"HPCDDP_LOCAL_RANK": "0", "HPCDDP_LOCAL_WORLD_SIZE": "3", "HPCDDP_LOCAL_JOB_ID": "77"},
            1,
        ),
    ],
)
def test_more_nccl_ranks_than_gpus_on_a_node_is_refused(environ, gpus):
    with pytest.raises(
        LaunchError,
        match=r"ranks on this node but this rank sees only "
        rf"{gpus} GPU\(s\).*HINT: .*--gpus-per-task=1",
    ):
        resolve(environ, gpus=gpus)


@pytest.mark.parametrize(
    "environ, gpus",
    [
        (torchrun_rank(3, 4, HPCDDP_BACKEND="gloo"), 2),  # gloo does not care
        (torchrun_rank(3, 4), 4),
        (slurm_step(0, 0, 0), 1),  # Slurm bound one GPU to each task
        (slurm_step(0, 0, 0, SLURM_GPUS_PER_TASK="2"), 2),
        # 3 tasks see 2 GPUs each: --gpu-bind=closest or sharing; the rendezvous tells them
        # apart by UUID (tests/unit/test_gpu_binding.py)
        (slurm_step(0, 0, 0), 2),
    ],
)
def test_enough_gpus_or_bound_gpus_are_accepted(environ, gpus):
    assert resolve(environ, gpus=gpus).device.startswith("cuda")
