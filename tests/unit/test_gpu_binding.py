"""Which GPU each rank uses, for every way Slurm (or the user) binds GPUs: one row per layout.

Each task resolves its place from an injected Slurm environment and device table (what CUDA
shows it under the CUDA_VISIBLE_DEVICES Slurm set), then the rendezvous's rule (`plan_devices`)
gives every rank its device from all the ranks' UUIDs, or refuses, naming ranks, host and GPU.
"""

import re

import pytest

from hpcddp.comm.rendezvous import Hello, plan_devices
from hpcddp.errors import LaunchError
from hpcddp.launch import gpus
from hpcddp.launch.resolve import place, resolve_env
from tests.fixtures.gpu_nodes import mig_gpus, node_gpus, seen_through, slurm_task


def block(nodes, per_node):
    """Slurm's default distribution: ranks fill a node before the next."""
    return [(r, r % per_node, r // per_node) for r in range(nodes * per_node)]


def cyclic(nodes, per_node):
    """``-m cyclic``: rank r on node r % nodes."""
    return [(r, r // nodes, r % nodes) for r in range(nodes * per_node)]


def hello_of(env, environ):
    """The rendezvous hello's GPU part, as `rendezvous.hello_of` fills it."""
    return Hello(
        rank=env.rank,
        host=env.hostname,
        world_size=env.world_size,
        resolved=[],
        routes={},
        interfaces={},
        user_ifname="",
        local_rank=env.local_rank,
        backend=env.backend,
        device=env.device,
        explicit=environ.get("HPCDDP_DEVICE", "").startswith("cuda:"),
        gpus=[g.__dict__ for g in env.gpus],
    )


def meet(tasks, cvd, nodes, per_node, gpus_of=node_gpus, **extra):
    """Resolve every task, then plan: ({rank: physical GPU uuid}, refusal or None)."""
    envs, hellos = {}, {}
    for rank, local, node in tasks:
        host = f"g{node + 1}"
        environ = slurm_task(rank, local, node, nodes, per_node, **extra)
        visible = cvd(local)
        if visible is not None:
            environ["CUDA_VISIBLE_DEVICES"] = visible
        table = seen_through(gpus_of(host), visible)
        env = resolve_env(environ, devices=lambda t=table: t, hostname=host, ancestors=lambda: [1])
        envs[rank], hellos[rank] = env, hello_of(env, environ)
    devices, refusal = plan_devices(hellos)
    if refusal is not None:
        return {}, refusal[1]
    used = {}
    for rank, env in envs.items():
        index = int(devices[rank].partition(":")[2])
        used[rank] = next(g.uuid for g in env.gpus if g.index == index)
    return used, None


def physical(host, index):
    return node_gpus(host)[index].uuid


# rows: layout, tasks, each local rank's CUDA_VISIBLE_DEVICES, and each rank's GPU as
# (node, physical index), worked out by hand from what the layout shows each task
IN_ORDER = [(0, 0), (0, 1), (0, 2), (0, 3)]
LAYOUTS = {
    "--gpus-per-task=1": (block(1, 4), lambda local: str(local), IN_ORDER),
    "--gpus-per-node=4, no binding": (block(1, 4), lambda local: None, IN_ORDER),
    # a task sees its socket's 2 of the node's 4 GPUs: refused before, by counting
    "--gpu-bind=closest": (
        block(1, 4),
        lambda local: "0,1" if local < 2 else "2,3",
        IN_ORDER,
    ),
    # -m block:cyclic puts local ranks 0 and 2 on socket 0: each guessing local_rank % 2,
    # both would take GPU 0; the second rank on socket 0 takes its second GPU
    "--gpu-bind=closest -m block:cyclic": (
        block(1, 4),
        lambda local: "0,1" if local % 2 == 0 else "2,3",
        [(0, 0), (0, 2), (0, 1), (0, 3)],
    ),
    "--gpu-bind=map_gpu:3,2,1,0": (
        block(1, 4),
        lambda local: str(3 - local),
        [(0, 3), (0, 2), (0, 1), (0, 0)],
    ),
    # rank r on node r % 2, its local rank r // 2 there, each node's GPUs in local-rank order
    "-m cyclic on 2 nodes x 4 GPUs": (
        cyclic(2, 4),
        lambda local: None,
        [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3)],
    ),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_rank_gets_its_own_gpu(layout):
    tasks, cvd, expected = LAYOUTS[layout]
    nodes = 1 + max(node for _, _, node in tasks)
    used, refusal = meet(tasks, cvd, nodes, len(tasks) // nodes)
    assert refusal is None
    assert used == {
        rank: physical(f"g{node + 1}", gpu) for rank, (node, gpu) in enumerate(expected)
    }


def test_a_task_that_sees_its_sockets_two_of_four_gpus_gets_a_cuda_device():
    environ = {**slurm_task(3, 3, 0, 1, 4), "CUDA_VISIBLE_DEVICES": "2,3"}
    table = seen_through(node_gpus("g1"), "2,3")
    env = resolve_env(environ, devices=lambda: table, hostname="g1", ancestors=lambda: [1])
    assert (env.device, env.backend) == ("cuda:1", "nccl")
    # the count alone, as resolve_env has always accepted it, gives the same answer
    counted = resolve_env(environ, cuda_devices=lambda: 2, hostname="g1", ancestors=lambda: [1])
    assert counted.device == "cuda:1"


@pytest.mark.parametrize(
    "layout, cvd, shared",
    [
        # every task sees the one GPU of the node: passes a count, then NCCL's "Duplicate GPU"
        ("--gpus-per-node=1 with 4 tasks", lambda local: "0", {0: "0, 1, 2, 3"}),
        ("map_gpu:0,0,1,1", lambda local: str(local // 2), {0: "0, 1", 1: "2, 3"}),
        ("closest, 3 tasks on a socket", lambda local: "0,1", {0: "0, 2", 1: "1, 3"}),
    ],
)
def test_ranks_on_one_gpu_are_refused_naming_ranks_host_and_gpu(layout, cvd, shared):
    used, refusal = meet(block(1, 4), cvd, 1, 4)
    assert refusal is not None and not used
    lines = refusal.split("\nhpcddp: error: ")
    assert len(lines) == len(shared)
    for line, (gpu, ranks) in zip(lines, shared.items(), strict=True):
        assert f"ranks {ranks} on g1 would all use GPU {physical('g1', gpu)}" in line
        assert "Duplicate GPU detected" in line and "HINT: " in line and "--gpus-per-task=1" in line


def test_gloo_ranks_may_share_a_gpu():
    used, refusal = meet(block(1, 2), lambda local: "0", 1, 2, HPCDDP_BACKEND="gloo")
    assert refusal is None and set(used.values()) == {physical("g1", 0)}


def test_mig_siblings_on_one_bus_are_refused_for_nccl_and_allowed_for_gloo():
    def by_uuid(local):  # Slurm hands each task one MIG instance by UUID
        return mig_gpus("g1")[local % 2].uuid

    _, refusal = meet(block(1, 2), by_uuid, 1, 2, gpus_of=mig_gpus)
    assert refusal is not None, "NCCL compares bus ids: two MIG instances are one GPU to it"
    assert "ranks 0, 1 on g1 would all use the GPU at bus 0000:3b:00.0" in refusal
    assert "MIG instances are one GPU to NCCL" in refusal
    used, refusal = meet(block(1, 2), by_uuid, 1, 2, gpus_of=mig_gpus, HPCDDP_BACKEND="gloo")
    assert refusal is None and used == {0: mig_gpus("g1")[0].uuid, 1: mig_gpus("g1")[1].uuid}


def test_gpus_on_other_hosts_with_the_same_bus_id_are_not_one_gpu():
    used, refusal = meet(cyclic(2, 1), lambda local: "0", 2, 1, gpus_of=mig_gpus)
    assert refusal is None and len(set(used.values())) == 2


def test_a_mig_instance_is_named_as_nvidia_smi_names_it():
    class Props:  # torch.cuda.get_device_properties of a MIG instance: bare UUID, MIG in name
        uuid, name = "c7384736-a75d-5afc-978f-d2f1294409fd", "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
        pci_domain_id, pci_bus_id, pci_device_id = 0, 0x3B, 0

    assert gpus._uuid(Props()) == "MIG-c7384736-a75d-5afc-978f-d2f1294409fd"
    Props.name = "NVIDIA H100 80GB HBM3"
    assert gpus._uuid(Props()).startswith("GPU-c7384736")
    gpu = gpus.Gpu(1, "MIG-c7384736-a75d", "", gpus._bus_id(Props()))
    assert gpus.describe(gpu) == "cuda:1 MIG-c7384736 0000:3b:00.0"  # `hpcddp check`'s gpu cell


def torchrun_rank(local, world, cvd):
    return {
        "RANK": str(local),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "g1",
        "MASTER_PORT": "29400",
        "CUDA_VISIBLE_DEVICES": cvd,
    }


@pytest.mark.parametrize(
    "cvd, expected",
    [("2,3", [2, 3]), ("3,2", [3, 2]), (f"{physical('g1', 3)},{physical('g1', 2)}", [3, 2])],
)
def test_a_users_own_cuda_visible_devices_is_followed(cvd, expected):
    hellos, envs = {}, {}
    for local in range(2):
        environ = torchrun_rank(local, 2, cvd)
        table = seen_through(node_gpus("g1"), cvd)
        env = resolve_env(environ, devices=lambda t=table: t, hostname="g1", ancestors=lambda: [1])
        envs[local], hellos[local] = env, hello_of(env, environ)
    devices, refusal = plan_devices(hellos)
    assert refusal is None
    for local in range(2):  # local rank i takes the i-th GPU the user listed
        gpu = envs[local].gpus[int(devices[local].partition(":")[2])]
        assert gpu.uuid == physical("g1", expected[local])


def test_an_explicit_device_is_kept_and_still_checked():
    tasks = block(1, 2)
    used, refusal = meet(tasks, lambda local: None, 1, 2, HPCDDP_DEVICE="cuda:3")
    assert used == {} and f"ranks 0, 1 on g1 would all use GPU {physical('g1', 3)}" in refusal


def test_a_torchrun_node_with_fewer_gpus_than_ranks_is_refused_where_it_starts():
    with pytest.raises(LaunchError, match=r"4 ranks on this node but this rank sees only 2"):
        resolve_env(
            {**torchrun_rank(3, 4, "0,1")},
            devices=lambda: seen_through(node_gpus("g1"), "0,1"),
            hostname="g1",
            ancestors=lambda: [1],
        )


# -- GPUs Slurm gave are GPUs used -------------------------------------------------------------


@pytest.mark.parametrize(
    "given, torch_cuda, device_files, extra, reason",
    [
        ({"SLURM_JOB_GPUS": "0,1"}, None, True, {}, r"CPU-only build.*HINT: install a CUDA"),
        (
            {"SLURM_GPUS_ON_NODE": "4"},
            "12.4",
            False,
            {"APPTAINER_CONTAINER": "/images/t.sif"},
            r"apptainer container without the GPUs.*--nv",
        ),
        (
            {"SLURM_STEP_GPUS": "2"},
            "12.4",
            False,
            {"ENROOT_ROOTFS": "/tmp/r"},
            r"pyxis container without the GPUs.*NVIDIA_VISIBLE_DEVICES",
        ),
        ({"SLURM_JOB_GPUS": "0"}, "12.4", True, {}, r"CUDA 12.4 cannot use them.*nvidia-smi"),
    ],
)
def test_a_rank_slurm_gave_gpus_that_sees_none_is_refused_with_the_reason(
    given, torch_cuda, device_files, extra, reason
):
    from hpcddp.launch.gpus import no_gpu_reason

    environ = {**slurm_task(1, 1, 0, 1, 2), **given, **extra}
    env, refusal = place(
        environ,
        devices=lambda: (),
        hostname="g1",
        ancestors=lambda: [1],
        why_no_gpu=lambda e: no_gpu_reason(e, torch_cuda, device_files),
    )
    assert env.rank == 1  # it still knows where the others meet, to tell them
    assert isinstance(refusal, LaunchError)
    assert re.search(rf"Slurm gave this job GPUs \({next(iter(given))}=.*{reason}", str(refusal))
    assert "HPCDDP_DEVICE=cpu" in str(refusal)


def test_cpu_on_purpose_or_no_gpus_given_trains_on_cpu():
    gave = {**slurm_task(1, 1, 0, 1, 2), "SLURM_JOB_GPUS": "0,1", "HPCDDP_DEVICE": "cpu"}
    assert (
        resolve_env(gave, devices=lambda: (), hostname="g1", ancestors=lambda: [1]).device == "cpu"
    )
    none = {**slurm_task(1, 1, 0, 1, 2), "SLURM_GPUS_ON_NODE": "0"}
    assert (
        resolve_env(none, devices=lambda: (), hostname="g1", ancestors=lambda: [1]).device == "cpu"
    )


def test_the_meeting_gives_each_rank_the_device_rank_0_assigned():
    """On a real store: under closest + block:cyclic, rank 2 guessed cuda:0 and gets cuda:1."""
    import dataclasses
    import datetime
    import threading

    import torch.distributed as dist

    from hpcddp.comm import rendezvous

    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=30))
    results = {}

    def one(rank):
        environ = {
            **slurm_task(rank, rank, 0, 1, 4),
            "CUDA_VISIBLE_DEVICES": "0,1" if rank % 2 == 0 else "2,3",
        }
        table = seen_through(node_gpus("g1"), environ["CUDA_VISIBLE_DEVICES"])
        env = resolve_env(environ, devices=lambda: table, hostname="g1", ancestors=lambda: [1])
        env = dataclasses.replace(env, master_port=server.port)
        store = server if rank == 0 else dist.TCPStore("127.0.0.1", server.port, None, False)
        hello = dataclasses.replace(hello_of(env, environ), resolved=["127.0.0.1"])
        hello = dataclasses.replace(hello, interfaces={"lo": ["127.0.0.1"]})
        results[rank] = (env.device, rendezvous.meet(store, env, hello, 20.0, prefix="g").device)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {
        0: ("cuda:0", "cuda:0"),
        1: ("cuda:1", "cuda:0"),  # its socket's first GPU: the first rank there
        2: ("cuda:0", "cuda:1"),  # socket 0's second rank: its second GPU, not rank 0's
        3: ("cuda:1", "cuda:1"),
    }


def test_a_machine_without_gpu_device_files_sees_no_gpu_without_asking_torch(tmp_path):
    assert gpus.visible_gpus(str(tmp_path)) == ()  # empty /dev: torch is not imported
    for name in ("nvidia0", "kfd", "dxg"):
        (tmp_path / name).touch()
        assert gpus.has_gpu_device_files(str(tmp_path))
        (tmp_path / name).unlink()
    (tmp_path / "nvme0").touch()
    assert not gpus.has_gpu_device_files(str(tmp_path))
    assert not gpus.has_gpu_device_files(str(tmp_path / "missing"))
