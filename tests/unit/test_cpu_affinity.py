"""CPUs for GPU ranks, on an injected topology: a fake sysfs tree and sinfo's view of the nodes.

The node of `tests.fixtures.gpu_nodes`: 64 CPUs on 2 NUMA nodes (0-15,32-47 and 16-31,48-63,
hyperthreads numbered after the cores, as Linux does), GPUs 0-1 on node 0 and 2-3 on node 1.
"""

import dataclasses
import os

import pytest

from hpcddp.comm import group
from hpcddp.config import from_dict
from hpcddp.launch import cpus
from hpcddp.launch.distenv import DistEnv
from hpcddp.launch.gpus import Gpu
from hpcddp.launch.resolve import resolve_env
from hpcddp.slurm import jobscript
from hpcddp.slurm.cpus_per_task import NodeShape, parse_sinfo, per_rank
from hpcddp.train.data import default_num_workers
from tests.fixtures.gpu_nodes import SOCKET_OF, node_gpus, slurm_task

NODE_CPUS = {0: "0-15,32-47", 1: "16-31,48-63"}


@pytest.fixture
def sysfs(tmp_path):
    """The kernel's view of the node: each GPU's NUMA node, each NUMA node's CPUs."""
    for gpu in node_gpus("g1"):
        device = tmp_path / "bus/pci/devices" / gpu.bus_id
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{SOCKET_OF[gpu.index]}\n")
    for node, cpulist in NODE_CPUS.items():
        folder = tmp_path / f"devices/system/node/node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpulist + "\n")
    return tmp_path


@pytest.mark.parametrize("index, node", [(0, 0), (1, 0), (2, 1), (3, 1)])
def test_each_gpu_rank_is_pinned_to_its_gpus_numa_node(sysfs, index, node):
    pinning = cpus.near_gpu(node_gpus("g1")[index], set(range(64)), sysfs)
    assert pinning.numa_node == node
    assert pinning.cpus == cpus.parse_cpulist(NODE_CPUS[node])


def test_pinning_only_narrows_what_slurm_allowed(sysfs):
    given = set(range(8)) | set(range(16, 24))  # --cpus-per-task=16 across both sockets
    assert cpus.near_gpu(node_gpus("g1")[2], given, sysfs).cpus == set(range(16, 24))
    # a task bound to socket 0 only, given a GPU on socket 1: it keeps what it has
    kept = cpus.near_gpu(node_gpus("g1")[3], set(range(8)), sysfs)
    assert (kept.cpus, kept.numa_node) == (set(range(8)), None)
    assert "none of its CPUs is on NUMA node 1" in kept.reason


def test_an_unknown_numa_node_leaves_the_rank_as_it_was(sysfs):
    (sysfs / "bus/pci/devices" / node_gpus("g1")[0].bus_id / "numa_node").write_text("-1\n")
    for gpu in (node_gpus("g1")[0], Gpu(0, "GPU-x", bus_id=""), Gpu(0, "GPU-y", bus_id="0:1")):
        assert cpus.near_gpu(gpu, {0, 1, 2}, sysfs).numa_node is None


def test_cpulists_round_trip():
    assert cpus.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert cpus.format_cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"


def test_joining_pins_a_gpu_rank_for_real_and_a_cpu_rank_not(tmp_path):
    before = os.sched_getaffinity(0)
    first = min(before)
    device = tmp_path / "bus/pci/devices/0000:1b:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("0\n")
    (tmp_path / "devices/system/node/node0").mkdir(parents=True)
    (tmp_path / "devices/system/node/node0/cpulist").write_text(f"{first}\n")
    gpu = Gpu(0, "GPU-a", "H100", "0000:1b:00.0")
    env = DistEnv(0, 0, 1, 1, 0, 1, "h", 1, "single", "", device="cuda:0", gpus=(gpu,))
    try:
        assert group.pin_near_gpu(env, False, tmp_path) is None  # dist.pin_cpus=false
        assert os.sched_getaffinity(0) == before
        pinning = group.pin_near_gpu(env, True, tmp_path)
        assert pinning is not None and os.sched_getaffinity(0) == {first}
        cpu_rank = DistEnv(0, 0, 1, 1, 0, 1, "h", 1, "single", "", gpus=(gpu,))
        assert group.pin_near_gpu(cpu_rank, True, tmp_path) is None
    finally:
        os.sched_setaffinity(0, before)


# -- DataLoader workers from the CPUs the rank was given ---------------------------------------


@pytest.mark.parametrize(
    "extra, allowed, workers",
    [
        ({}, range(16), 15),  # no --cpus-per-task in the environment: the binding says 16
        ({}, range(1), 0),  # Slurm gave the task one CPU on a 64-core node: no workers
        ({"SLURM_CPUS_PER_TASK": "8"}, range(4), 3),  # srun did not pass it on: 4 it is
        ({"SLURM_CPUS_PER_TASK": "8"}, range(16, 32), 7),  # pinned to a socket, Slurm's 8
    ],
)
def test_loader_workers_come_from_the_cpus_the_rank_was_given(extra, allowed, workers):
    environ = slurm_task(0, 0, 0, 1, 4, **extra)
    env = resolve_env(environ, cuda_devices=lambda: 0, hostname="g1", ancestors=lambda: [1])
    assert default_num_workers(env, environ, allowed=set(allowed)) == workers


@pytest.mark.parametrize("local_rank, node", [(0, 0), (3, 1)])
def test_after_pinning_the_loader_workers_share_the_numa_node_with_its_ranks_only(
    sysfs, local_rank, node
):
    """torchrun: 4 ranks in one task on the node of 4 GPUs, each already pinned to its GPU's
    NUMA node (32 CPUs): 2 ranks share those, not 4."""
    env = DistEnv(local_rank, local_rank, 4, 4, 0, 1, "g1", 29500, "torchrun", "", hostname="g1")
    env = dataclasses.replace(env, device=f"cuda:{local_rank}", gpus=tuple(node_gpus("g1")))
    pinned = cpus.parse_cpulist(NODE_CPUS[node])
    assert cpus.default_workers(env, {}, pinned, sysfs) == 32 // 2 - 1
    unpinned = set(range(64))  # dist.pin_cpus=false: every local rank on every CPU
    assert cpus.default_workers(env, {}, unpinned, sysfs) == 64 // 4 - 1


# -- --cpus-per-task for a GPU job ---------------------------------------------------------------

# sinfo -h -N -o '%c %G %P': a line per node and partition
SINFO = """\
64 gpu:h100:4(S:0-1) gpu*
64 gpu:h100:4(S:0-1) gpu*
256 gpu:a100:8,gpu:t4:0 big
128 (null) cpu
"""


def test_sinfo_lines_give_each_partitions_nodes():
    text = SINFO
    assert parse_sinfo(text, "") == [NodeShape(64, 4)] * 2  # the default partition
    assert parse_sinfo(text, "big") == [NodeShape(256, 8)]
    assert parse_sinfo(text, "cpu") == [NodeShape(128, 0)]


def slurm(**values):
    return from_dict({"slurm": values}).slurm


@pytest.mark.parametrize(
    "values, shapes, expected",
    [
        ({"gpus_per_node": 4, "tasks_per_node": 4}, [NodeShape(64, 4)], 16),
        ({"gpus_per_node": 4, "tasks_per_node": 4}, [NodeShape(32, 8), NodeShape(64, 4)], 4),
        ({"gpus_per_node": 8, "tasks_per_node": 8}, [NodeShape(256, 8)], 16),  # capped
        ({"gpus_per_node": 1, "tasks_per_node": 4}, [NodeShape(64, 4)], 16),
        ({"gpus_per_node": 2, "tasks_per_node": 8}, [NodeShape(64, 4)], 8),  # more ranks: less
        ({"gpus_per_node": 4}, [], 4),  # sinfo not there: a modest default
        ({"tasks_per_node": 4}, [NodeShape(128, 0)], 1),  # a CPU job: as before
        ({"gpus_per_node": 4, "cpus_per_task": 2}, [NodeShape(64, 4)], 2),  # the config's word
    ],
)
def test_a_gpu_jobs_default_cpus_per_task_comes_from_its_nodes(values, shapes, expected):
    assert per_rank(slurm(**values), shapes) == expected


def test_the_job_script_asks_for_the_nodes_cpus_per_gpu():
    config = from_dict({"slurm": {"gpus_per_node": 4, "tasks_per_node": 4}})
    asked = []

    def nodes(partition):
        asked.append(partition)
        return [NodeShape(64, 4)]

    text = jobscript.render(jobscript.JobSpec(config, "c.yaml"), node_shapes=nodes)
    assert "#SBATCH --cpus-per-task=16" in text.splitlines() and asked == [""]
    torchrun = from_dict(
        {"slurm": {"gpus_per_node": 4, "tasks_per_node": 4, "launcher": "torchrun"}}
    )
    text = jobscript.render(jobscript.JobSpec(torchrun, "c.yaml"), node_shapes=nodes)
    assert "#SBATCH --cpus-per-task=64" in text.splitlines()  # one task holds the node's ranks
    cpu_only = jobscript.render(jobscript.JobSpec(from_dict({}), "c.yaml"), node_shapes=nodes)
    assert "#SBATCH --cpus-per-task=1" in cpu_only.splitlines() and len(asked) == 2
