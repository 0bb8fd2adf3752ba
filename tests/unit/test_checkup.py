"""`hpcddp check`'s rules and table on plain facts: each problem found, named and fixed."""

import copy

from hpcddp.check import checkup, table

N1 = {"lo": ["127.0.0.1"], "ib0": ["172.31.0.11"], "eth0": ["10.0.0.11"]}
N2 = {"lo": ["127.0.0.1"], "ib0": ["172.31.0.12"], "ens4": ["10.0.0.12"]}
VERSIONS = {"torch": "2.13.0", "hpcddp": "0.1.0", "python": "3.11.2", "cuda": "", "nccl": ""}


def rank(r, host, **changes):
    """One rank's facts on a healthy 2-node, 2-ranks-per-node CPU job."""
    facts = {
        "rank": r,
        "local_rank": r % 2,
        "local_world_size": 2,
        "host": host,
        "launcher": "slurm",
        "master_addr": "n1",
        "cpus": 4,
        "slurm_cpus_per_task": 4,
        "srun_cpus_per_task": "4",
        "workers": 3,
        "gpus_visible": 0,
        "gpu_ids": "",
        "interface": "eth0" if host == "n1" else "ens4",
        "address": "10.0.0.11" if host == "n1" else "10.0.0.12",
        "link_mbps": 10000,
        "interfaces": N1 if host == "n1" else N2,
        "master_resolves": ["10.0.0.11"],
        "own_name": ["10.0.0.11"] if host == "n1" else ["10.0.0.12"],
        "versions": dict(VERSIONS),
        "mem_free_gb": 100.0,
        "disk_free_gb": 500.0,
        "run_dir": "/shared/run",
        "sees_run_dir": True,
        "compute_ms": 10.0,
    }
    facts.update(changes)
    return facts


def report(ranks=None, **changes):
    base = {
        "ranks": ranks or [rank(0, "n1"), rank(1, "n1"), rank(2, "n2"), rank(3, "n2")],
        "job_id": "77",
        "backend": "gloo",
        "master_addr": "n1",
        "master_port": 24000,
        "master_ip": "10.0.0.11",
        "port_explicit": False,
        "gpus_asked": 0,
        "allreduce": {
            "small_bytes": 8,
            "small_ms": 0.5,
            "bytes": 16 << 20,
            "ms": 30.0,
            "bus_gbps": 6.7,
            "link_gbps": 10.0,
        },
        "pairs": [
            {"src": "n1", "dst": "n2", "gbps": 14.0},
            {"src": "n2", "dst": "n1", "gbps": 15.0},
        ],
        "pair_bytes": 4 << 20,
        "compute_what": "384x384 matmul x8",
    }
    base.update(changes)
    return base


def lines(found):
    return [p.line() for p in found]


def test_a_healthy_job_has_no_problems_and_says_it_would_train():
    good = report()
    assert checkup.problems(good) == []
    text = table.as_text(good, [])
    assert text.splitlines()[-1] == "no problems found: the job should train."
    header = text.splitlines()[2].split()
    assert header[:5] == ["rank", "host", "local", "cpus", "gpu"]
    assert "2     n2    0/2    4     -    ens4 10.0.0.12" in text
    assert "node pairs (4 MB each way): n1 -> n2 14 Gb/s, n2 -> n1 15 Gb/s" in text


def with_ranks(**changes_by_host):
    """The healthy job with some hosts' facts changed."""
    ranks = []
    for r, host in enumerate(["n1", "n1", "n2", "n2"]):
        ranks.append(rank(r, host, **changes_by_host.get(host, {})))
    return ranks


def test_debian_127_0_1_1_is_a_warning_that_names_the_nodes():
    debian = with_ranks(n1={"own_name": ["127.0.1.1"]}, n2={"own_name": ["127.0.1.1"]})
    (found,) = checkup.problems(report(debian))
    assert found.severity == "warning"
    assert found.text.startswith("n[1-2] resolve their own names to 127.0.1.1")


def test_a_node_resolving_the_master_elsewhere_is_an_error():
    wrong = with_ranks(n2={"master_resolves": ["10.9.9.9"]})
    found = checkup.problems(report(wrong))
    assert lines(found)[0].startswith(
        "error: MASTER_ADDR=n1 resolves to an address n1 does not hold on n2 (n2: 10.9.9.9)"
    )


def test_mismatched_torch_is_an_error_naming_each_version_and_its_nodes():
    skew = with_ranks(n2={"versions": {**VERSIONS, "torch": "2.12.0"}})
    found = checkup.problems(report(skew))
    assert lines(found) == [
        "error: torch differs between nodes (2.13.0 on n1; 2.12.0 on n2): ranks must run the "
        "same software. Fix: install the same environment on every node (one venv or container "
        "image on a shared file system)."
    ]
    text = table.as_text(report(skew), found)
    assert text.splitlines()[-1] == "1 error(s), 0 warning(s): the job would not train."


def on_gpus(uuids_by_rank, chosen):
    """Facts for ranks 0-1 on n1 and 2-3 on n2, each seeing ``uuids_by_rank[r]``."""
    return [
        rank(
            r,
            "n1" if r < 2 else "n2",
            gpus_visible=len(uuids_by_rank[r]),
            gpu_ids=",".join(map(str, range(len(uuids_by_rank[r])))),
            gpu_uuids=uuids_by_rank[r],
            gpu_index=chosen[r],
        )
        for r in range(4)
    ]


def test_asked_gpus_that_no_rank_sees_are_an_error():
    found = checkup.gpu_problems(with_ranks(), "gloo", 4)
    assert lines(found)[0].startswith("error: n1: slurm.gpus_per_node=4 but its ranks see no GPU")


def test_ranks_on_one_gpu_are_the_rendezvous_error_naming_ranks_host_and_gpu():
    one = {r: ["GPU-a" if r < 2 else "GPU-b"] for r in range(4)}  # --gpus-per-node=1
    found = lines(checkup.gpu_problems(on_gpus(one, dict.fromkeys(range(4), 0)), "nccl", 1))
    assert found[0].startswith("error: ranks 0, 1 on n1 would all use GPU GPU-a")
    assert found[1].startswith("error: ranks 2, 3 on n2 would all use GPU GPU-b")
    assert checkup.gpu_problems(on_gpus(one, dict.fromkeys(range(4), 0)), "gloo", 1) == []


def test_per_task_and_per_socket_gpus_are_told_apart_by_uuid_not_by_number():
    per_task = {r: [f"GPU-{r}"] for r in range(4)}  # every rank's only GPU is its number 0
    assert checkup.gpu_problems(on_gpus(per_task, dict.fromkeys(range(4), 0)), "nccl", 1) == []
    # --gpu-bind=closest: each rank sees its socket's 2 GPUs, fewer than the node's ranks
    closest = {0: ["GPU-0", "GPU-1"], 1: ["GPU-0", "GPU-1"], 2: ["GPU-2", "GPU-3"]}
    closest[3] = closest[2]
    assert checkup.gpu_problems(on_gpus(closest, {0: 0, 1: 1, 2: 0, 3: 1}), "nccl", 2) == []


def test_mig_siblings_on_one_bus_are_one_gpu_to_nccl():
    mig = {r: [f"MIG-{r % 2}"] for r in range(4)}  # each rank its own MIG instance by UUID
    facts = on_gpus(mig, dict.fromkeys(range(4), 0))
    for f in facts:  # both instances on a node are cut from the GPU at bus 3b
        f["gpu_bus_ids"] = ["0000:3b:00.0"]
    found = lines(checkup.gpu_problems(facts, "nccl", 1))
    assert found[0].startswith("error: ranks 0, 1 on n1 would all use the GPU at bus 0000:3b")
    assert found[1].startswith("error: ranks 2, 3 on n2 would all use the GPU at bus 0000:3b")
    assert checkup.gpu_problems(facts, "gloo", 1) == []


def test_gpus_no_rank_uses_are_a_warning():
    node = {r: [f"GPU-{r // 2}{i}" for i in range(4)] for r in range(4)}  # 4 on each node
    found = lines(checkup.gpu_problems(on_gpus(node, {0: 0, 1: 1, 2: 0, 3: 1}), "nccl", 4))
    assert len(found) == 2
    assert found[0].startswith("warning: n1: 4 GPUs visible to 2 rank(s): 2 stay idle")


def test_the_table_shows_each_ranks_gpu_and_cpus():
    ranks = on_gpus({r: ["GPU-5f2b0c3e-aaaa"] * 1 for r in range(4)}, dict.fromkeys(range(4), 0))
    for f in ranks:
        f.update(gpu=f"cuda:0 GPU-5f2b0c3e-{f['rank']}", cpus=16, cpu_list="0-15", numa_node=0)
    text = table.as_text(report(ranks), [])
    assert "16 (numa 0: 0-15)  cuda:0 GPU-5f2b0c3e-2" in text


def test_srun_cpus_per_task_pitfall_and_starving_loaders():
    pitfall = with_ranks(n2={"cpus": 1, "srun_cpus_per_task": ""})
    (found,) = checkup.cpu_problems(pitfall)
    assert found.text.startswith("n2: the job asked --cpus-per-task=4 but each rank got 1 CPU(s)")
    assert "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in found.text
    starving = with_ranks(n1={"workers": 8, "cpus": 4, "slurm_cpus_per_task": 0})
    (found,) = checkup.cpu_problems(starving)
    assert found.text.startswith(
        "n1: data.num_workers gives each rank 8 loader worker(s) on 4 CPU(s)"
    )


def test_a_problem_every_node_has_is_one_line_naming_them_all():
    starving = {"workers": 8, "cpus": 4, "slurm_cpus_per_task": 0}
    found = checkup.problems(report(with_ranks(n1=starving, n2=starving)))
    assert lines(found) == [
        "warning: n[1-2]: data.num_workers gives each rank 8 loader worker(s) on 4 CPU(s), so "
        "loaders and training fight for them. Fix: data.num_workers=-1 (CPUs minus one), or more "
        "--cpus-per-task."
    ]


def test_a_run_dir_other_nodes_cannot_see_is_an_error():
    (found,) = checkup.resource_problems(with_ranks(n2={"sees_run_dir": False}))
    assert found.line().startswith("error: n2 cannot see the files rank 0 writes in run.dir")


def test_low_memory_and_disk_are_warnings():
    found = checkup.resource_problems(with_ranks(n1={"mem_free_gb": 0.5, "disk_free_gb": 1.0}))
    assert [p.text.split(":")[1].strip()[:14] for p in found] == [
        "0.5 GB of memo",
        "1.0 GB free wh",
    ]


def test_a_slow_sender_is_named_with_two_nodes_and_three():
    two = [{"src": "n1", "dst": "n2", "gbps": 15.0}, {"src": "n2", "dst": "n1", "gbps": 0.04}]
    (found,) = checkup.pair_problems(two)
    assert found.text.startswith("slow node n2: n2 -> n1 0.04 Gb/s, against 15 Gb/s")
    assert "n2's outgoing link (or n1's incoming) is slow" in found.text
    three = [
        {"src": a, "dst": b, "gbps": 0.05 if a == "n3" else 12.0}
        for a in ("n1", "n2", "n3")
        for b in ("n1", "n2", "n3")
        if a != b
    ]
    (found,) = checkup.pair_problems(three)
    assert found.text.startswith("slow node n3:") and "n3's outgoing link is slow" in found.text
    receiving = [dict(p, gbps=0.05 if p["dst"] == "n1" else 12.0) for p in three]
    (found,) = checkup.pair_problems(receiving)
    assert found.text.startswith("slow node n1:") and "n1's incoming link is slow" in found.text


def test_noise_between_healthy_pairs_names_no_one():
    noisy = [{"src": "n1", "dst": "n2", "gbps": 9.0}, {"src": "n2", "dst": "n1", "gbps": 14.0}]
    assert checkup.pair_problems(noisy) == []


def test_a_pair_that_moved_nothing_is_an_error():
    (found,) = checkup.pair_problems(
        [{"src": "n1", "dst": "n2", "gbps": 0.0, "error": "timed out"}]
    )
    assert found.line().startswith("error: no data went from n1 to n2 (timed out)")


def test_a_throttled_cpu_is_named():
    (found,) = checkup.compute_problems(with_ranks(n2={"compute_ms": 85.0}))
    assert found.text.startswith(
        "slow node n2: the same computation takes 85 ms there against 10 ms"
    )


def test_bus_bandwidth_far_below_the_link_is_a_warning():
    slow = report(allreduce={**report()["allreduce"], "bus_gbps": 0.04})
    assert any(
        "0.4% of the 10 Gb/s the slowest link reports" in p.text for p in checkup.problems(slow)
    )


def test_a_hand_picked_port_in_the_ephemeral_range_is_a_warning():
    assert checkup.port_problems(40000, True)[0].text.startswith("MASTER_PORT=40000 is in Linux's")
    assert checkup.port_problems(40000, False) == [] and checkup.port_problems(25000, True) == []


def test_errors_come_before_warnings():
    older = {"own_name": ["127.0.1.1"], "versions": {**VERSIONS, "hpcddp": "0.0.9"}}
    both = copy.deepcopy(with_ranks(n1={"own_name": ["127.0.1.1"]}, n2=older))
    assert [p.severity for p in checkup.problems(report(both))] == ["error", "warning"]


# a 7B fp32 model with 24 blocks of 250M and 1B outside them, on 80 GB GPUs
SEVEN_B = {
    "params": 7_000_000_000,
    "param_bytes": 4,
    "largest_block_params": 250_000_000,
    "root_params": 1_000_000_000,
}


def gpu_job(room_gb, strategy="ddp"):
    ranks = [
        rank(r, f"n{r // 2 + 1}", model_room_bytes=room_gb * 2**30, model_room_kind="GPU")
        for r in range(4)
    ]
    ranks[3]["model_room_bytes"] -= 2**30  # the tightest rank is the one judged
    return report(ranks, model=SEVEN_B, strategy=strategy, precision="bf16")


def test_a_model_too_big_for_ddp_is_an_error_whose_fix_is_fsdp():
    # ddp: 7e9 * 16 = 112e9 B = 104 GB; fsdp at 4: 28e9 + 1.25e9 * 2 = 30.5e9 B = 28.4 GB
    found = checkup.problems(gpu_job(80))
    assert lines(found) == [
        "error: the model's state needs 104 GB per rank under dist.strategy=ddp, before "
        "activations, and n2 has 79 GB GPU per rank: does not fit: set dist.strategy=fsdp "
        "(needs 28.4 GB per rank). Fix: set dist.strategy=fsdp."
    ]
    text = table.as_text(gpu_job(80), found)
    assert (
        "model state per rank (7,000,000,000 parameters; weights, gradients, AdamW moments; "
        "activations not estimated): ddp 104 GB, fsdp 28.4 GB at 4 ranks; n2 has 79 GB GPU per "
        "rank; dist.strategy=ddp does not fit: set dist.strategy=fsdp (needs 28.4 GB per rank)"
    ) in text


def test_a_model_that_fits_sharded_or_whole_is_no_problem_and_says_fits():
    assert checkup.problems(gpu_job(80, "fsdp")) == []
    assert "dist.strategy=fsdp fits" in table.as_text(gpu_job(80, "fsdp"), [])
    assert checkup.problems(gpu_job(141)) == []


def test_an_fsdp_model_built_whole_first_says_how_much_host_memory_a_rank_needs_then():
    job = gpu_job(80, "fsdp")
    job["model"] = {**SEVEN_B, "fsdp_builds_whole": True}
    assert "fsdp builds it whole first: 26.1 GB of host memory a rank" in table.as_text(job, [])
    job["model"]["fsdp_builds_whole"] = False  # built on the meta device: only its shards
    assert "builds it whole" not in table.as_text(job, [])


def test_a_model_too_big_even_sharded_asks_for_more_ranks():
    found = lines(checkup.problems(gpu_job(24, "fsdp")))
    assert len(found) == 1 and "does not fit even sharded. Fix: more ranks" in found[0]


def test_a_model_not_measured_says_why_in_the_table():
    text = table.as_text(report(model=None, model_unknown="no model.factory configured"), [])
    assert "model state per rank: not estimated (no model.factory configured)" in text


def test_a_node_is_named_from_four_times_slower_transfers_and_three_times_slower_compute():
    """docs/preflight.md's thresholds, at their edges: a direction four times slower than the
    fastest pair names its node, 3.8x does not; compute three times slower does, 2.8x not."""

    def pairs(slow_gbps):
        return [
            {"src": "n1", "dst": "n2", "gbps": 10.0},
            {"src": "n2", "dst": "n1", "gbps": slow_gbps},
        ]

    assert [p.text[:13] for p in checkup.pair_problems(pairs(2.4))] == ["slow node n2:"]
    assert checkup.pair_problems(pairs(2.6)) == []
    (found,) = checkup.compute_problems(with_ranks(n2={"compute_ms": 32.0}))
    assert found.text.startswith("slow node n2: the same computation takes 32 ms there")
    assert checkup.compute_problems(with_ranks(n2={"compute_ms": 28.0})) == []
