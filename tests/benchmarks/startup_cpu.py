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
Slurm look-ups answered locally, ``hpcddp`` is ``python -m hpcddp train``. Two figures, medians:

- to the first step: CPU of the process (every thread) and its children until its first
  optimizer step has returned (a global optimizer hook planted through ``sitecustomize`` in
  both arms alike, as the arm imports torch, so neither runs modified): the start-up a
  restart pays;
- whole process: user + system CPU of the process and its children, exit included.

Both arms run from compiled bytecode, as an installed package does (a warm-up round of each
compiles it into a cache of the benchmark's own): with ``PYTHONDONTWRITEBYTECODE`` set, as in
some shells, every process would compile hpcddp's sources anew and the raw script's few lines.
Target (issue 16 item 5): hpcddp <= 1.1x raw.
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
# Planted in both arms: the CPU used when the first optimizer step returns, into a file.
FIRST_STEP_PROBE = """
import importlib.abc, importlib.util, os, resource, sys

WATCHED = "torch.optim.optimizer"


def _first_step(optimizer, args, kwargs):
    if _first_step.done:
        return
    _first_step.done = True
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    with open(os.environ["BENCH_FIRST_STEP_FILE"], "w") as out:
        out.write(f"{used}\\n")


_first_step.done = False


class _HookWhenLoaded(importlib.abc.MetaPathFinder):
    # the hook is registered as the arm itself imports torch: importing torch here would
    # change when it is imported, not just watch
    def find_spec(self, name, path, target=None):
        if name != WATCHED:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.register_optimizer_step_post_hook(_first_step)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _HookWhenLoaded())
"""
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


def environment(repo: pathlib.Path, work: pathlib.Path) -> dict[str, str]:
    """No launcher's variables, what the raw script reads, the probe, a bytecode cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    probe = work / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(FIRST_STEP_PROBE)
    return {
        **env,
        "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": str(os.getpid()),
        "PYTHONPATH": f"{repo}{os.pathsep}{probe}",
        "PYTHONPYCACHEPREFIX": str(work / "bytecode"),
        "BENCH_FIRST_STEP_FILE": str(work / "first-step"),
    }  # fmt: skip


def cpu_s(command: list[str], env: dict[str, str], repo: pathlib.Path) -> tuple[float, float]:
    """(CPU seconds to the first step, in all) of ``command`` (run in ``repo``) and its children."""
    first_step = pathlib.Path(env["BENCH_FIRST_STEP_FILE"])
    first_step.unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, env=env, cwd=repo, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    whole = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(first_step.read_text()), whole


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.startup_cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repo", type=pathlib.Path, default=REPO, help="whose hpcddp runs")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    times: dict[str, list[tuple[float, float]]] = {"raw": [], "hpcddp": []}
    with tempfile.TemporaryDirectory(prefix="hpcddp-startup-cpu-") as folder:
        work = pathlib.Path(folder)
        env = environment(repo, work)
        for command in commands(work / "warm-up").values():
            cpu_s(command, env, repo)  # compiles the bytecode; not counted
        for round_ in range(args.rounds):
            for arm, command in commands(work / str(round_)).items():
                times[arm].append(cpu_s(command, env, repo))
    print(f"CPU-s of one process, {STEPS} steps + eval + checkpoint (medians of {args.rounds}), "
          f"hpcddp from {repo}")  # fmt: skip
    for label, index in (("to the first step", 0), ("whole process", 1)):
        raw = statistics.median(t[index] for t in times["raw"])
        ours = statistics.median(t[index] for t in times["hpcddp"])
        print(f"{label + ':':<19} raw {raw:.2f}  hpcddp {ours:.2f}  ratio {ours / raw:.3f} "
              "(target <= 1.10)")  # fmt: skip
    for arm, runs in times.items():
        print(f"per run, {arm}: first step {[round(t[0], 2) for t in runs]}, "
              f"whole {[round(t[1], 2) for t in runs]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
