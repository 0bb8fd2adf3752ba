"""The hand-written Slurm DDP script `tests/benchmarks/startup.py` measures hpcddp against.

What a careful user writes from the PyTorch tutorial, launched with ``srun`` (one task per
rank): read the rank and world from Slurm's variables, take the first host of the step as the
master (its address from Slurm, and the interface that reaches it), join a gloo group, then the
same work the trainer does in the benchmark's config: the quickstart model and data,
DistributedSampler, DDP, AdamW, STEPS optimizer steps, one evaluation pass all-reduced over the
ranks, and one checkpoint written by rank 0. It prints its own wall time so the two arms can be
compared phase by phase.

Usage (inside an allocation): ``srun python -m tests.benchmarks.raw_ddp STEPS RUN_DIR``.
"""

import os
import pathlib
import subprocess
import sys
import time
import zlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from examples.quickstart import make_dataset, make_model


def master_address() -> str:
    """The step's first host's address, as Slurm knows it (its own name may resolve to
    127.0.1.1 on its own node, Debian's installer line)."""
    nodes = os.environ["SLURM_STEP_NODELIST"]
    out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True)
    first = out.stdout.split()[0]
    node = subprocess.run(["scontrol", "-o", "show", "node", first], capture_output=True, text=True)
    return node.stdout.split("NodeAddr=")[1].split()[0]


def interface_to(address: str) -> str:
    """The interface that carries ``address`` (on its own node) or routes to it."""
    own = subprocess.run(["ip", "-o", "-4", "addr", "show", "to", address],
                         capture_output=True, text=True).stdout.split()  # fmt: skip
    if own:
        return own[1]
    route = subprocess.run(["ip", "-o", "route", "get", address], capture_output=True, text=True)
    return route.stdout.split(" dev ")[1].split()[0]


def main(steps: int, run_dir: pathlib.Path) -> None:
    """Train ``steps`` steps as rank SLURM_PROCID of SLURM_NTASKS."""
    started = time.perf_counter()
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    os.environ["MASTER_ADDR"] = master_address()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface_to(os.environ["MASTER_ADDR"]))
    job_key = f"{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '0')}"
    os.environ["MASTER_PORT"] = str(20000 + zlib.crc32(job_key.encode()) % 12000)
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))
    torch.set_num_threads(cpus)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    train, evaluation = make_dataset(train_size=steps * 32 * world, eval_size=64 * world)
    model = DDP(make_model())
    sampler = DistributedSampler(train, world, rank, seed=0)
    loader = DataLoader(train, batch_size=32, sampler=sampler)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for inputs, targets in loader:
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64)
    eval_sampler = DistributedSampler(evaluation, world, rank, shuffle=False)
    with torch.no_grad():
        for inputs, targets in DataLoader(evaluation, batch_size=32, sampler=eval_sampler):
            sums[0] += F.cross_entropy(model(inputs), targets, reduction="sum").double()
            sums[1] += targets.numel()
    dist.all_reduce(sums)
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                   run_dir / "checkpoint.pt")  # fmt: skip
    dist.barrier()
    # rank 0 serves the store: leaving first would abort a peer still tearing down
    store = dist.distributed_c10d._get_default_store()
    dist.destroy_process_group()
    if rank != 0:
        store.add("left", 1)
    while rank == 0 and store.add("left", 0) < world - 1:
        time.sleep(0.01)
    if rank == 0:
        print(f"raw: {world} ranks, {steps} steps in {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]), pathlib.Path(sys.argv[2]))
