"""What the hang watchdog costs a step: the same step loop with and without its thread.

Usage::

    python -m tests.benchmarks.watchdog            # 7 rounds of 1500 steps per arm
    python -m tests.benchmarks.watchdog --quick    # 2 rounds of 300: a smoke run

One process trains the quickstart's MLP (forward, backward, SGD step) and writes the step into
`hpcddp.comm.hang.Beat`, as the trainer does. The ``watchdog`` arm runs `Watchdog` beside it at
its fastest tick (0.05 s, the tick of a 1 s budget; the trainer's is budget / 20, at most 1 s),
so the figure is an upper bound. Arms alternate; the median of per-round medians is reported.
"""

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from examples.quickstart import make_model
from hpcddp.comm import hang
from hpcddp.comm.watchdog import Place, Watchdog


def one_round(steps: int, watched: bool, folder: pathlib.Path) -> float:
    """Median ms per step over ``steps`` steps."""
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(32, 16), torch.randint(0, 4, (32,))
    beat = hang.Beat()
    dog = None
    if watched:  # 1 s budget: its fastest tick; steps take milliseconds, so it never fires
        place = Place(0, 1, "here", folder)
        dog = Watchdog(beat, hang.Budget(1.0, 10.0), place, dist.HashStore()).start()
    times = []
    try:
        for step in range(steps):
            started = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            beat.step = step + 1
            times.append(time.perf_counter() - started)
    finally:
        if dog is not None:
            dog.stop()
    return statistics.median(times) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.watchdog")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 300 steps")
    args = parser.parse_args(argv)
    rounds, steps = (2, 300) if args.quick else (args.rounds, args.steps)
    torch.set_num_threads(1)
    found: dict[str, list[float]] = {"plain": [], "watchdog": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for arm in found:
                found[arm].append(one_round(steps, arm == "watchdog", pathlib.Path(tmp)))
    plain, watched = (statistics.median(found[arm]) for arm in ("plain", "watchdog"))
    for label, arm, median in (
        ("plain step", "plain", plain),
        ("with watchdog", "watchdog", watched),
    ):
        print(f"{label:<16} {median:.4f} ms  (rounds: {[round(x, 4) for x in found[arm]]})")
    print(f"difference       {watched - plain:+.4f} ms  ratio {watched / plain:.3f}")
    print("(one process, one thread for torch; a shared machine is noisy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
