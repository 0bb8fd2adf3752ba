"""A local launch's cost: ranks forked from one zygote against each rank loading torch itself.

Usage::

    python -m tests.benchmarks.local_launch                # 3 rounds, 2 and 4 ranks
    python -m tests.benchmarks.local_launch --quick        # one round, 2 ranks

Both arms run the same short job, ``hpcddp train`` of the quickstart for STEPS steps, one
evaluation, one checkpoint, in N local processes, alternated:

- ``exec'd``: N ``python -m hpcddp train`` processes started by this script with the
  environment the launcher gives each (`hpcddp.launch.local.child_env`), as the launcher
  started them before the zygote: every rank imports torch and DDP's dynamo itself;
- ``forked``: ``hpcddp train --nproc N``: the launcher's zygote loads them once and forks
  each rank (`hpcddp.cli.zygote`).

Figures: CPU seconds of all the processes (user + system, children included), and wall seconds
to the last exit; medians. CPU is what a launch costs whatever shares the cores.
"""

import argparse
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from hpcddp.launch.local import child_env, free_port

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 20
QUIET = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
JOB = ["train", "examples/quickstart.yaml", f"train.max_steps={STEPS}"]


def _exec_d(nproc: int, run_dir: pathlib.Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "hpcddp", *JOB, f"run.dir={run_dir}"]
    ranks = [
        subprocess.Popen(command, cwd=REPO, env=child_env(r, nproc, port, os.environ), **QUIET)
        for r in range(nproc)
    ]
    if any(rank.wait() for rank in ranks):
        raise RuntimeError("a rank failed")


def _forked(nproc: int, run_dir: pathlib.Path) -> None:
    command = [sys.executable, "-m", "hpcddp", *JOB, f"run.dir={run_dir}", "--nproc", str(nproc)]
    subprocess.run(command, cwd=REPO, check=True, **QUIET)


ARMS = {"exec'd": _exec_d, "forked": _forked}


def _measured(arm, nproc: int, work: pathlib.Path) -> tuple[float, float]:
    run_dir = pathlib.Path(tempfile.mkdtemp(dir=work))
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    arm(nproc, run_dir)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.local_launch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--quick", action="store_true", help="one round, 2 ranks")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.ranks = 1, [2]
    with tempfile.TemporaryDirectory() as work:
        for name in ARMS:  # a warm-up of each: bytecode compiled, files cached
            _measured(ARMS[name], 1, pathlib.Path(work))
        print(f"local launch of {STEPS} steps, medians of {args.rounds}, load average "
              f"{os.getloadavg()[0]:.1f}")  # fmt: skip
        print(f"{'ranks':>5} {'arm':<8} {'CPU s':>7} {'wall s':>7} {'CPU ratio':>9}")
        for nproc in args.ranks:
            figures: dict[str, list[tuple[float, float]]] = {name: [] for name in ARMS}
            for _ in range(args.rounds):
                for name, arm in ARMS.items():
                    figures[name].append(_measured(arm, nproc, pathlib.Path(work)))
            base = statistics.median(cpu for cpu, _ in figures["exec'd"])
            for name, runs in figures.items():
                cpu = statistics.median(c for c, _ in runs)
                wall = statistics.median(w for _, w in runs)
                print(f"{nproc:>5} {name:<8} {cpu:>7.2f} {wall:>7.2f} {cpu / base:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
