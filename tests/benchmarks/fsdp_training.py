"""Step time of the trainer under fsdp against a hand-written FSDP2 loop, side by side.

Usage::

    python -m tests.benchmarks.fsdp_training              # 3 interleaved runs per arm, 2 ranks
    python -m tests.benchmarks.fsdp_training --runs 5 --steps 60 --nproc 4

Both arms train the fsdp test transformer (`tests.fixtures.sharded_transformer`, here 4 blocks
of width 256) with the same mesh and settings: ``fully_shard`` on each block then the root
(the root not resharded after forward), fp32, fused AdamW, clipping at 1.0 by the whole
gradient norm, one micro-batch per step, PyTorch's DistributedSampler. ``hand`` is the loop as
the FSDP2 tutorial writes it (`hand_written`), ``trainer`` is ``hpcddp train``. A step is
timed as `tests.benchmarks.training` times it: the model factory both arms use records
``time.perf_counter()`` at each training forward, and a step is the gap between two; the
figure is the median gap after the first 10, the median over ranks and runs. Target (issue 24
item 7): trainer <= 1.03x hand. Run it on an idle machine: a busy one varies more than that.
"""

import argparse
import atexit
import itertools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = "tests/fixtures/sharded_transformer.yaml"
MODEL = {"width": 256, "layers": 4, "heads": 4}
BATCH = 8


def timed_model(**kwargs) -> torch.nn.Module:
    """The test transformer; each training forward's start time goes to $FSDP_BENCH_DIR."""
    from tests.fixtures.sharded_transformer import TinyTransformer

    model = TinyTransformer(**kwargs)
    stamps: list[float] = []
    model.register_forward_pre_hook(
        lambda module, _: stamps.append(time.perf_counter()) if module.training else None
    )
    folder = pathlib.Path(os.environ["FSDP_BENCH_DIR"])
    atexit.register(lambda: (folder / f"times-{os.getpid()}.json").write_text(json.dumps(stamps)))
    return model


def hand_written(steps: int) -> None:
    """The FSDP2 tutorial loop with the trainer's settings (run in each rank)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.utils.data import DataLoader, DistributedSampler

    from tests.fixtures.sharded_transformer import make_dataset

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = timed_model(**MODEL)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.003, fused=True)
    data = make_dataset(train_size=4096)
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True)
    done = 0
    while done < steps:
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["tokens"]), batch["labels"])
            loss.backward()
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            torch.nn.utils.clip_grads_with_norm_(list(model.parameters()), 1.0, norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break
    dist.destroy_process_group()


def run(arm: str, steps: int, nproc: int, folder: pathlib.Path) -> float:
    """One run of ``arm``; its median step in ms."""
    folder.mkdir(parents=True)
    env = {**os.environ, "FSDP_BENCH_DIR": str(folder), "OMP_NUM_THREADS": "1"}
    if arm == "hand":
        command = [
            sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
            "-m", "tests.benchmarks.fsdp_training", "--hand", str(steps),
        ]  # fmt: skip
    else:
        model = ", ".join(f"{k}: {v}" for k, v in MODEL.items())
        command = [
            sys.executable, "-m", "hpcddp", "train", CONFIG, f"run.dir={folder / 'run'}",
            "model.factory=tests.benchmarks.fsdp_training:timed_model", f"model.kwargs={{{model}}}",
            "data.kwargs={train_size: 4096}", f"data.batch_size={BATCH}", "data.drop_last=true",
            "train.grad_accum_steps=1", f"train.max_steps={steps}", "train.log_every_steps=10",
            "train.checkpoint_every_steps=100000", "train.eval_every_steps=100000",
            "--nproc", str(nproc),
        ]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{arm} failed:\n{result.stderr[-3000:]}")
    medians = []
    for times in folder.glob("times-*.json"):
        stamps = json.loads(times.read_text())
        gaps = [b - a for a, b in itertools.pairwise(stamps[10:])]
        medians.append(statistics.median(gaps) * 1e3)
    return statistics.median(medians)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--hand", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hand:
        hand_written(args.hand)
        return 0
    times: dict[str, list[float]] = {"hand": [], "trainer": []}
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(args.runs):
            for arm in times:
                times[arm].append(
                    run(arm, args.steps, args.nproc, pathlib.Path(scratch) / f"{arm}{i}")
                )
    hand, trainer = (statistics.median(times[a]) for a in ("hand", "trainer"))
    print(f"{args.nproc} ranks, fsdp, {args.steps} steps, CPU (gloo); median ms/step per run:")
    for arm, values in times.items():
        print(f"  {arm:8} {' '.join(f'{v:.1f}' for v in values)}")
    print(f"{'hand-written ms/step':>22}{'trainer ms/step':>17}{'ratio':>8}")
    print(f"{hand:>22.1f}{trainer:>17.1f}{trainer / hand:>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
