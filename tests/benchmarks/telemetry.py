"""What per-rank telemetry costs a training step: the bookkeeping alone, side by side.

Usage: ``python -m tests.benchmarks.telemetry [--steps N] [--quick]``.

Two gloo ranks on this machine run the same loop twice, interleaved: a stand-in step (a small
matmul and an all-reduce of its result, which keeps the ranks in step as DDP's gradient
all-reduce does; far cheaper than any real model's step, so the overhead is not hidden in a long
one) plain, and the same step with everything the trainer adds for telemetry: the clock around
the loader and the forward / backward / optimizer phases, counting the batch's samples and
tokens, and every ``log_every`` steps closing the interval and posting the asynchronous
all-gather that is read once it has completed. The difference per step is the cost (target <=
0.05 ms).
"""

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hpcddp.train import batches
from hpcddp.train.telemetry import IntervalClock, RankFigures

LOG_EVERY = 10


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def plain_steps(steps: int, batch: tuple, weight: torch.Tensor) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        inputs, _ = batch
        dist.all_reduce(inputs @ weight)
    return time.perf_counter() - started


def watched_steps(steps: int, batch: tuple, weight: torch.Tensor, figures: RankFigures) -> float:
    clock = IntervalClock(torch.device("cpu"))
    started = time.perf_counter()
    for step in range(1, steps + 1):
        figures.finish(wait=False)  # the last logging step's gather, if it has completed
        measured = clock.measures_split(step % LOG_EVERY == 0)
        waited = time.perf_counter()
        raw = batch
        clock.add("data_wait_s", time.perf_counter() - waited)
        samples, tokens = batches.size_of(raw), batches.tokens_of(raw)
        inputs, _ = raw
        with clock.phase("forward_s", measured):
            out = inputs @ weight
        with clock.phase("backward_s", measured):
            dist.all_reduce(out)
        with clock.phase("optimizer_s", measured):
            pass
        clock.step(samples, tokens, measured)
        if step % LOG_EVERY == 0:
            figures.finish()  # as the trainer does: a gather still in flight is waited for
            figures.start(step, clock.close_interval())
    figures.finish()
    return time.perf_counter() - started


def rank_main(rank: int, world: int, port: int, steps: int, rounds: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    figures = RankFigures(rank, world, ["localhost"] * world)
    batch = (torch.randn(32, 64), torch.zeros(32))
    weight = torch.randn(64, 64)
    plain, watched = [], []
    for _ in range(rounds):
        dist.barrier()
        plain.append(plain_steps(steps, batch, weight) / steps)
        dist.barrier()
        watched.append(watched_steps(steps, batch, weight, figures) / steps)
    if rank == 0:
        out["plain"], out["watched"] = plain, watched
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.telemetry")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a smoke test: 500 steps, 2 rounds")
    args = parser.parse_args(argv)
    steps, rounds = (500, 2) if args.quick else (args.steps, args.rounds)
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(rank_main, args=(2, free_port(), steps, rounds, out), nprocs=2)
        plain, watched = statistics.median(out["plain"]), statistics.median(out["watched"])
    cost_ms = (watched - plain) * 1e3
    print(f"telemetry per step, 2 gloo ranks, {steps} steps x {rounds} rounds, log every "
          f"{LOG_EVERY}")  # fmt: skip
    print(f"{'plain step':<28}{plain * 1e3:>10.4f} ms")
    print(f"{'with telemetry':<28}{watched * 1e3:>10.4f} ms")
    print(f"{'cost':<28}{cost_ms:>10.4f} ms  target <= 0.05")
    return 0


if __name__ == "__main__":
    sys.exit(main())
