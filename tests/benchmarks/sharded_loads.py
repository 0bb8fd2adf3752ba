"""Sharded checkpoint loads on 2 ranks: against a raw read of the same bytes, and resharded.

One fsdp model with AdamW state (the fsdp test transformer, `tests.fixtures.sharded_transformer`)
is saved as a sharded checkpoint twice, through `hpcddp.storage.sharded.ShardedStore` and DCP as
training saves it (every file's digest in the marker): once by 4 ranks, once by 2. Then 2 ranks
time these arms, alternated, every checkpoint file evicted from the page cache before each (the
slowest rank's time counts), each rank with its share of the cores for torch's threads as the
trainer gives it (`hpcddp.comm.group.cpu_threads`):

- **raw**: each rank reads the files its rank wrote of the 2-rank checkpoint (8 MB buffer);
- **same-size load**: the marker checked, then the 2-rank checkpoint loaded into the model and
  the optimizer, every file read checked against its digest
  (`hpcddp.train.sharded_state.load_sharded`, what a resume does);
- **not verified**: the same without the digests (what verification costs);
- **resharded load**: the same-size load's steps, from the 4-rank checkpoint (each rank reads 2
  files);
- **torch's reader**: ``dcp.load`` with torch's own ``FileSystemReader`` (no digests), the
  state dicts taken before: what the load cost before hpcddp's reader.

The garbage collector is left as a resuming rank has it (`hpcddp.launch.collector.resume`:
start-up's objects frozen), so that no arm pays a full collection over torch's objects that
another does not.

Targets (issue 24 item 7): load <= 1.25x raw; resharded <= 1.5x same-size.

``python -m tests.benchmarks.sharded_loads [--widths 512 1024 1280] [--layers 8] [--runs 5]
[--quick]``
"""

import argparse
import datetime
import os
import pathlib
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from hpcddp import leaving
from hpcddp.launch import collector
from hpcddp.storage.sharded import ShardedStore
from hpcddp.train import sharded_state
from tests.benchmarks.checkpoints import evict
from tests.fixtures.sharded_transformer import TinyTransformer

ARMS = ("raw", "same-size load", "not verified", "resharded load", "torch's reader")
TARGETS = {"same-size load": ("raw", 1.25), "resharded load": ("same-size load", 1.5)}
BASES = {"not verified": "raw", "torch's reader": "raw"}


def _trained(
    width: int, layers: int, world: int, seed: int
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model sharded per block over ``world`` ranks, after one AdamW step (state exists)."""
    torch.manual_seed(seed)
    model = TinyTransformer(width=width, layers=layers, heads=4)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 32, (2, 8))
    torch.nn.functional.cross_entropy(model(tokens), torch.tensor([0, 1])).backward()
    optimizer.step()
    return model, optimizer


def _save(root: pathlib.Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    store = ShardedStore(root)
    if dist.get_rank() == 0:
        store.open(1)
    dist.barrier()
    dist.checkpoint.save(sharded_state.named(model, optimizer), checkpoint_id=store.path_for(1))
    dist.barrier()
    if dist.get_rank() == 0:
        store.complete(1, {"world_size": dist.get_world_size(), "strategy": "fsdp"})
    dist.barrier()


def _timed(work, files: list[pathlib.Path]) -> tuple[float, float]:
    """The slowest rank's wall seconds for ``work``, and its CPU seconds (user and system, every
    thread: what the work costs whatever else shares the cores), every file evicted first."""
    if dist.get_rank() == 0:
        for path in files:
            evict(path)
    dist.barrier()
    started, cpu = time.perf_counter(), time.process_time()
    work()
    took = torch.tensor([time.perf_counter() - started, time.process_time() - cpu])
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took[0]), float(took[1])


def _raw(folder: pathlib.Path) -> None:
    buffer = bytearray(8 << 20)
    mine = [p for p in folder.iterdir() if p.name.startswith(f"__{dist.get_rank()}_")]
    if dist.get_rank() == 0:
        mine.append(folder / ".metadata")
    for path in mine:
        with open(path, "rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass


def _load(
    folder: pathlib.Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    verify: bool = True,
) -> None:
    digests = ShardedStore(folder.parent.parent).check(folder)["digests"]
    sharded_state.load_sharded(folder, model, optimizer, digests if verify else None)


def _zeroed(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()


def _loaded(model: torch.nn.Module) -> None:
    """Each load arm must have put weights in, not only read files."""
    total = torch.tensor(
        [sum(float(p.detach().to_local().abs().sum()) for p in model.parameters())]
    )
    dist.all_reduce(total)
    if not float(total):
        raise RuntimeError("the load left the weights zero")


def _rank(rank: int, world: int, args: argparse.Namespace, root: str, out: dict) -> None:
    leaving.register()  # then leave as a rank does: torch's native threads torn down at
    # exit while the peer leaves can abort a process (SIGABRT) that did all its work
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(max((os.cpu_count() or 1) // world, 1))  # as the trainer does
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(minutes=10)
    )
    try:
        if args.phase == "write":
            folder = pathlib.Path(root) / f"written-by-{world}"
            _save(folder, *_trained(args.width, args.layers, world, seed=0))
        else:
            _time_arms(rank, world, args, root, out)
    finally:
        dist.destroy_process_group()
    leaving.leave(0)


def _time_arms(rank: int, world: int, args: argparse.Namespace, root: str, out: dict) -> None:
    model, optimizer = _trained(args.width, args.layers, world, seed=1)
    collector.resume()  # start-up's objects frozen, as in a rank that resumes: else a full
    # collection walking all of torch's objects lands inside some timed loads, not others
    same = ShardedStore(pathlib.Path(root) / "written-by-2").path_for(1)
    other = ShardedStore(pathlib.Path(root) / "written-by-4").path_for(1)
    files = [p for d in (same, other) for p in d.iterdir()]
    times: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}
    for _ in range(args.runs):
        times["raw"].append(_timed(lambda: _raw(same), files))
        for arm, folder, verify in (
            ("same-size load", same, True),
            ("not verified", same, False),
            ("resharded load", other, True),
        ):
            _zeroed(model)
            times[arm].append(
                _timed(lambda f=folder, v=verify: _load(f, model, optimizer, v), files)
            )
            _loaded(model)
        state = sharded_state.named(model, optimizer)
        times["torch's reader"].append(
            _timed(lambda s=state: dist.checkpoint.load(s, checkpoint_id=same), files)
        )
    if rank == 0:
        out.update(times)


def _spawn(world: int, args: argparse.Namespace, root: str) -> dict:
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(world, args, root, out), nprocs=world, join=True)
    return dict(out)


def _measure(args: argparse.Namespace, width: int) -> None:
    """Both checkpoints of the model at ``width`` written, the arms timed, the table printed."""
    args.width = width
    with tempfile.TemporaryDirectory(dir=".") as root:
        args.phase = "write"
        _spawn(4, args, root)
        _spawn(2, args, root)
        args.phase = "load"
        times = _spawn(2, args, root)
        folder = ShardedStore(pathlib.Path(root) / "written-by-2").path_for(1)
        size_mb = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
    wall = {arm: statistics.median(t[0] for t in times[arm]) for arm in ARMS}
    cpu = {arm: statistics.median(t[1] for t in times[arm]) for arm in ARMS}
    print(
        f"{size_mb:.0f} MB sharded checkpoint (width {width}, model + AdamW), 2 ranks loading, "
        f"CPU (gloo), {args.runs} run(s) of each, alternated, files evicted, load average "
        f"{os.getloadavg()[0]:.1f}; medians of the slowest rank"
    )
    print(f"{'arm':<16} {'wall s':>8} {'ratio':>6} {'CPU s':>8} {'ratio':>6}  target")
    for arm in ARMS:
        base, limit = TARGETS.get(arm, (BASES.get(arm), None))
        ratios = [f"{m[arm] / m[base]:6.2f}" if base else " " * 6 for m in (wall, cpu)]
        target = f"  wall <= {limit:.2f}x {base}" if limit else ""
        print(f"{arm:<16} {wall[arm]:8.3f} {ratios[0]} {cpu[arm]:8.3f} {ratios[1]}{target}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.sharded_loads")
    parser.add_argument("--widths", type=int, nargs="+", default=[512, 1024, 1280])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a small model, one run")
    parser.add_argument("--port", type=int, default=29733)
    args = parser.parse_args(argv)
    if args.quick:
        args.widths, args.layers, args.runs = [64], 2, 1
    for width in args.widths:
        _measure(args, width)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
