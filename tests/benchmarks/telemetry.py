"""What per-rank telemetry costs a training step: the bookkeeping alone, side by side.

Usage: ``python -m tests.benchmarks.telemetry [--steps N] [--quick]``.

Two gloo ranks on this machine run the same loop twice, interleaved: a stand-in step (a small
matmul and an all-reduce of its result, which keeps the ranks in step as DDP's gradient
all-reduce does; far cheaper than any real model's step, so the overhead is not hidden in a long
one) plain, and the same step with everything the trainer adds for telemetry: the clock around
the loader and the forward / backward / optimizer phases, counting the batch's samples and
tokens, and every ``log_every`` steps closing the interval and posting the asynchronous
all-gather that is read once it has completed. It prints the difference per step, and the
time the main thread spends inside the telemetry calls (timed around each, the step's own work
taken out; the gather's transfer runs on gloo's own thread), which is the cost (target <= 0.05
ms): on a loaded 2-core machine the difference is dominated by the ranks' scheduling jitter.
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


def watched_steps(
    steps: int, batch: tuple, weight: torch.Tensor, figures: RankFigures
) -> tuple[float, float]:
    """(seconds in all, seconds the main thread spent in the telemetry calls)."""
    clock, now = IntervalClock(torch.device("cpu")), time.perf_counter
    spent, started = 0.0, now()
    for step in range(1, steps + 1):
        t0 = now()
        figures.finish(wait=False)  # the last logging step's gather, if it has completed
        measured = clock.measures_split(step % LOG_EVERY == 0)
        waited = now()
        raw = batch
        clock.add("data_wait_s", now() - waited)
        samples, tokens = batches.size_of(raw), batches.tokens_of(raw)
        inputs, _ = raw
        t1 = now()
        with clock.phase("forward_s", measured):
            inner = now()
            out = inputs @ weight
            body = now() - inner
        with clock.phase("backward_s", measured):
            inner = now()
            dist.all_reduce(out)
            body += now() - inner
        with clock.phase("optimizer_s", measured):
            pass
        t2 = now()
        clock.step(samples, tokens, measured)
        if step % LOG_EVERY == 0:
            figures.finish()  # as the trainer does: a gather still in flight is waited for
            figures.start(step, clock.close_interval())
        spent += (t1 - t0) + (t2 - t1 - body) + (now() - t2)
    figures.finish()
    return now() - started, spent


def rank_main(rank: int, world: int, port: int, steps: int, rounds: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    figures = RankFigures(rank, world, ["localhost"] * world)
    batch = (torch.randn(32, 64), torch.zeros(32))
    weight = torch.randn(64, 64)
    plain, watched, alone = [], [], []
    for _ in range(rounds):
        dist.barrier()
        plain.append(plain_steps(steps, batch, weight) / steps)
        dist.barrier()
        took, spent = watched_steps(steps, batch, weight, figures)
        watched.append(took / steps)
        alone.append(spent / steps)
    if rank == 0:
        out["plain"], out["watched"], out["alone"] = plain, watched, alone
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
        alone = statistics.median(out["alone"])
    cost_ms = (watched - plain) * 1e3
    print(f"telemetry per step, 2 gloo ranks, {steps} steps x {rounds} rounds, log every "
          f"{LOG_EVERY}")  # fmt: skip
    print(f"{'plain step':<28}{plain * 1e3:>10.4f} ms")
    print(f"{'with telemetry':<28}{watched * 1e3:>10.4f} ms")
    print(f"{'difference':<28}{cost_ms:>10.4f} ms  (the step's own noise included)")
    print(f"{'cost':<28}{alone * 1e3:>10.4f} ms  target <= 0.05 (main thread, in telemetry)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
