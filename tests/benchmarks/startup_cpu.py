"""CPU seconds of one process doing a whole short job: hpcddp against the raw DDP script.

Usage::

    python -m tests.benchmarks.startup_cpu              # 5 rounds of each arm, alternated
    python -m tests.benchmarks.startup_cpu --rounds 2   # a quicker look
    python -m tests.benchmarks.startup_cpu --repo ../main   # another checkout's hpcddp (a baseline)

Why CPU seconds and not wall time: at start-up every rank imports torch and builds its model at
once, so on a node the ranks share, what a rank costs is its CPU time; it is also far less
disturbed by other work on a loaded machine than wall time. Both arms run as a world of one in
a fresh process, doing the same work as in `tests.benchmarks.startup` (the quickstart model for
STEPS steps, one evaluation, one checkpoint): ``raw`` is `tests.benchmarks.raw_ddp` with its
Slurm look-ups answered locally, ``hpcddp`` is ``python -m hpcddp train``. The figure is
user + system CPU of the process and its children, medians. Target (issue 16 item 5): hpcddp
<= 1.1x raw.
"""

import argparse
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 20
RAW = (
    "import sys, pathlib, tests.benchmarks.raw_ddp as raw\n"
    "raw.master_address = lambda: '127.0.0.1'\n"
    "raw.interface_to = lambda address: 'lo'\n"
    "raw.main(int(sys.argv[1]), pathlib.Path(sys.argv[2]))\n"
)
_LAUNCHER = ("SLURM_", "SRUN_", "TORCHELASTIC_", "HPCDDP_LOCAL_")


def commands(run_dir: pathlib.Path) -> dict[str, list[str]]:
    """Each arm's command for one run in ``run_dir``."""
    quick = [
        f"data.kwargs={{train_size: {STEPS * 32}, eval_size: 64}}", "data.batch_size=32",
        f"train.max_steps={STEPS}", "train.epochs=1", "optim.lr=0.003", "optim.warmup_steps=0",
        "optim.schedule=constant", "data.num_workers=0", "train.log_every_steps=1000",
    ]  # fmt: skip
    return {
        "raw": [sys.executable, "-c", RAW, str(STEPS), str(run_dir / "raw")],
        "hpcddp": [sys.executable, "-m", "hpcddp", "train", "examples/quickstart.yaml",
                   f"run.dir={run_dir / 'hpcddp'}", *quick],
    }  # fmt: skip


def environment() -> dict[str, str]:
    """This environment without any launcher's variables, plus what the raw script reads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return {**env, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": str(os.getpid())}


def cpu_s(command: list[str], env: dict[str, str], repo: pathlib.Path) -> float:
    """User + system CPU seconds of ``command`` (run in ``repo``) and everything it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, env=env, cwd=repo, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.startup_cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repo", type=pathlib.Path, default=REPO, help="whose hpcddp runs")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    env = {**environment(), "PYTHONPATH": str(repo)}
    times: dict[str, list[float]] = {"raw": [], "hpcddp": []}
    with tempfile.TemporaryDirectory(prefix="hpcddp-startup-cpu-") as folder:
        for round_ in range(args.rounds):
            for arm, command in commands(pathlib.Path(folder) / str(round_)).items():
                times[arm].append(cpu_s(command, env, repo))
    raw, ours = statistics.median(times["raw"]), statistics.median(times["hpcddp"])
    print(f"CPU-s of one process, {STEPS} steps + eval + checkpoint (medians of {args.rounds}), "
          f"hpcddp from {repo}")  # fmt: skip
    print(f"raw {raw:.2f}  hpcddp {ours:.2f}  ratio {ours / raw:.3f} (target <= 1.10)")
    print(f"per run: raw {[round(t, 2) for t in times['raw']]}, "
          f"hpcddp {[round(t, 2) for t in times['hpcddp']]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
