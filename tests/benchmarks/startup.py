"""Whole-job wall time of hpcddp against a raw Slurm DDP script, at 8 and 32 ranks, on Slurm.

Usage (root, from the repository root)::

    python -m tests.benchmarks.startup                # 8 and 32 ranks, 3 runs each
    python -m tests.benchmarks.startup --quick        # 4 ranks, 1 run: a smoke test
    python -m tests.benchmarks.startup --quick --slurm-conf PATH   # on a running cluster

It starts a cluster of its own (tests/cluster/local-slurm.sh, instance HPCDDP_SLURM_INSTANCE or
9: 8 nodes of 4 CPUs, beside any other cluster), then alternates the two arms, each a real
``sbatch`` job doing the same work: the quickstart model for STEPS steps, one evaluation, one
checkpoint. ``raw`` is `tests/benchmarks/raw_ddp.py` under ``srun``; ``hpcddp`` is
``sbatch/train.sh``; both read their Python from compiled bytecode, as installed packages are,
after an unmeasured job that imports torch on every rank (a fresh cluster's first job is slow).
The time is from submission until Slurm calls the job COMPLETED (scheduling included, alike for
both; the state polled every 0.2 s). Then it prints hpcddp's start-up timeline from its summary.json
(seconds per phase, the slowest rank per phase). Target: hpcddp within 1.05x of raw.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from hpcddp.train.timeline import table

REPO = pathlib.Path(__file__).resolve().parents[2]
CLUSTER = REPO / "tests" / "cluster" / "local-slurm.sh"
INSTANCE = os.environ.get("HPCDDP_SLURM_INSTANCE", "9")  # a session's own, when it has one
GEOMETRY = {4: (2, 2), 8: (8, 1), 32: (8, 4)}  # ranks: (nodes, ranks per node)


def start_cluster(nodes: int) -> dict[str, str]:
    """The benchmark's own cluster; the environment its clients need."""
    env = {**os.environ, "HPCDDP_SLURM_INSTANCE": INSTANCE, "HPCDDP_SLURM_NODES": str(nodes)}
    subprocess.run(["bash", str(CLUSTER), "start"], env=env, check=True, capture_output=True)
    printed = subprocess.run(["bash", str(CLUSTER), "env"], env=env, check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
    exported = dict(line.removeprefix("export ").split("=", 1) for line in printed.splitlines())
    return {**os.environ, "SLURM_CONF": exported["SLURM_CONF"]}


def compiled(env: dict[str, str], cache: pathlib.Path) -> dict[str, str]:
    """``env`` whose Pythons read hpcddp from compiled bytecode, as an installed package is read
    (with ``PYTHONDONTWRITEBYTECODE`` set, every rank would compile hpcddp's sources anew)."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "hpcddp", "tests", "examples"],
                   env=env, cwd=REPO, check=True, capture_output=True)  # fmt: skip
    return env


def sbatch_wait(env: dict[str, str], options: list[str], command: list[str]) -> float:
    """Seconds from submission to the end of the job; fails loudly if the job failed.

    Polled every 0.2 s: ``sbatch --wait`` polls so coarsely that both arms came out in whole
    multiples of its interval.
    """
    started = time.perf_counter()
    submitted = subprocess.run(
        ["sbatch", "--parsable", *options, *command],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    job = submitted.stdout.strip().split(";")[0]
    while (state := job_state(env, job)) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        time.sleep(0.2)
    took = time.perf_counter() - started
    if state != "COMPLETED":
        outputs = [o.split("=", 1)[1] for o in options if o.startswith("--output=")]
        files = [pathlib.Path(o.replace("%j", job)) for o in outputs]
        found = [f for o in files for f in o.parent.glob(o.name.replace("%x", "*"))]
        text = "\n".join(f.read_text()[-3000:] for f in found)
        raise SystemExit(f"job {job} ended {state} ({' '.join(command)}):\n{text}")
    return took


def job_state(env: dict[str, str], job: str) -> str:
    """Slurm's state of ``job`` (COMPLETED once its batch script ended well)."""
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=env,
                           capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    return shown.split("JobState=")[1].split()[0] if "JobState=" in shown else "UNKNOWN"


def arms(ranks: int, steps: int, work: pathlib.Path, run: int) -> dict[str, list[str]]:
    """The sbatch arguments of each arm for one run."""
    quick = [
        f"data.kwargs={{train_size: {steps * 32 * ranks}, eval_size: {64 * ranks}}}",
        "data.batch_size=32", f"train.max_steps={steps}", "train.epochs=1", "optim.lr=0.003",
        "optim.warmup_steps=0", "optim.schedule=constant", "data.num_workers=0",
        "train.log_every_steps=1000",
    ]  # fmt: skip
    raw = f"srun {sys.executable} -m tests.benchmarks.raw_ddp {steps} {work / f'raw-{run}'}"
    return {
        "raw": ["--wrap", raw],
        "hpcddp": ["sbatch/train.sh", "examples/quickstart.yaml",
                   f"run.dir={work / f'hpcddp-{run}'}", *quick],
    }  # fmt: skip


def measure(env: dict[str, str], ranks: int, steps: int, runs: int, work: pathlib.Path) -> dict:
    """Alternate raw and hpcddp ``runs`` times at ``ranks``; medians and the last timeline."""
    nodes, per_node = GEOMETRY[ranks]
    work.mkdir(parents=True, exist_ok=True)
    options = [
        f"--nodes={nodes}",
        f"--ntasks-per-node={per_node}",
        "--cpus-per-task=1",
        f"--output={work}/%x-%j.out",
        f"--export=ALL,HPCDDP_PYTHON={sys.executable}",
    ]
    # The first job on a fresh cluster took 2-3x longer whichever ran it (42 s against 16 s for
    # the raw arm at 8 ranks): an unmeasured job that imports torch on every rank first.
    warm_up = f"srun {sys.executable} -c 'import torch.distributed, torch.nn.parallel'"
    sbatch_wait(env, [*options, "--job-name=warm-up"], ["--wrap", warm_up])
    times: dict[str, list[float]] = {"raw": [], "hpcddp": []}
    for run in range(runs):
        for arm, command in arms(ranks, steps, work, run).items():
            times[arm].append(sbatch_wait(env, [*options, f"--job-name={arm}"], command))
    summary = json.loads((work / f"hpcddp-{runs - 1}" / "summary.json").read_text())
    return {"ranks": ranks, **{k: statistics.median(v) for k, v in times.items()},
            "runs": times, "timeline": summary.get("timeline")}  # fmt: skip


def report(rows: list[dict]) -> str:
    """The side-by-side table, the per-run times, and each timeline."""
    lines = ["ranks  raw s  hpcddp s  ratio (target <= 1.05)"]
    for row in rows:
        ratio = row["hpcddp"] / row["raw"]
        lines.append(f"{row['ranks']:>5}  {row['raw']:>5.1f}  {row['hpcddp']:>8.1f}  {ratio:.3f}")
    for row in rows:
        lines.append(f"\n{row['ranks']} ranks, per run: raw {row['runs']['raw']}, "
                     f"hpcddp {row['runs']['hpcddp']}")  # fmt: skip
        if row["timeline"]:
            lines.append(table(row["timeline"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.startup")
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32], choices=sorted(GEOMETRY))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="4 ranks, 1 run")
    parser.add_argument("--slurm-conf", help="use this running cluster (2+ nodes), not our own")
    args = parser.parse_args(argv)
    ranks, runs = ([4], 1) if args.quick else (args.ranks, args.runs)
    own = args.slurm_conf is None
    env = (
        start_cluster(max(GEOMETRY[r][0] for r in ranks))
        if own
        else {**os.environ, "SLURM_CONF": args.slurm_conf}
    )
    try:
        with tempfile.TemporaryDirectory(prefix="hpcddp-startup-") as folder:
            env = compiled(env, pathlib.Path(folder) / "bytecode")
            rows = [measure(env, r, args.steps, runs, pathlib.Path(folder) / str(r)) for r in ranks]
    finally:
        if own:
            stop = {**os.environ, "HPCDDP_SLURM_INSTANCE": INSTANCE}
            subprocess.run(["bash", str(CLUSTER), "stop"], env=stop, capture_output=True)
    print(report(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
