"""Step time on one GPU: the trainer against a hand-written DDP + NCCL loop.

Usage::

    python -m tests.gpu.step_time                     # 3 runs per arm, medium model: ~1.5 min
    python -m tests.gpu.step_time --runs 5 --steps 400 --model small
    python -m tests.gpu.step_time --device cpu --quick   # the script itself, on a CPU (gloo)

Each run is a fresh process, a world of one on cuda:0 (NCCL), training the benchmark's MLP on
its synthetic data for a fixed number of steps, either with `Trainer` or with a hand-written loop
as a GPU user would write it: DDP with ``device_ids``, a DataLoader with pinned memory and
non-blocking copies, fused AdamW (the trainer's default optimizer), TF32 matmuls (the trainer's
default ``train.tf32``), ``zero_grad(set_to_none=True)``. Steps are timed as in
`tests.benchmarks.training`: a forward pre-hook records when each training forward starts, so
neither loop carries timing code; per run the median gap after the warm-up steps, then the
median over runs. The arms alternate, so drift hits both alike. Nothing here is asserted: it
prints the figures for the GPU docs (`tests/gpu/run.sh` runs it after the tier).
"""

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from tests.benchmarks.training import (
    BATCH_SIZE,
    MODELS,
    StepClock,
    bench_config,
    mlp,
    run_median_ms,
    synthetic_data,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
ARMS = ("hand", "trainer")
RUN_TIMEOUT_S = 240


def hand_written(config_path: str, device: torch.device, clock: StepClock) -> None:
    """The loop a GPU user writes, world of one (``env://``: MASTER_ADDR/PORT are set)."""
    from hpcddp.config import load_config

    config = load_config(config_path)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
        with warnings.catch_warnings():  # torch 2.9-2.11 warn at the legacy TF32 setting
            warnings.simplefilter("ignore")
            torch.set_float32_matmul_precision("high")
    dist.init_process_group(
        backend, rank=0, world_size=1, device_id=device if backend == "nccl" else None
    )
    torch.manual_seed(config.run.seed)
    model = clock.attach(mlp(**config.model.kwargs).to(device))
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    dataset = synthetic_data(**config.data.kwargs)
    sampler = DistributedSampler(dataset, 1, 0, shuffle=True, seed=config.run.seed)
    loader = DataLoader(
        dataset, batch_size=BATCH_SIZE, sampler=sampler, pin_memory=device.type == "cuda"
    )
    fused = True if device.type == "cuda" else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.optim.lr, fused=fused)
    steps = 0
    while steps < config.train.max_steps:
        for inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            F.cross_entropy(ddp(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
            if steps == config.train.max_steps:
                break
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.destroy_process_group()


def trainer(config_path: str, clock: StepClock) -> None:
    """The trainer, unmodified, on the same model and data."""
    from hpcddp.config import load_config
    from hpcddp.launch.resolve import resolve_env
    from hpcddp.train.factories import import_factory
    from hpcddp.train.trainer import Trainer

    config = load_config(config_path)
    factory = import_factory(config.model.factory, "model")
    model_fn = lambda **kwargs: clock.attach(factory(**kwargs))  # noqa: E731
    dataset_fn = import_factory(config.data.factory, "data")
    Trainer(model_fn, dataset_fn, config).fit(resolve_env())


def worker(arm: str, config_path: str, result_path: str, device: str) -> int:
    """One run of one arm (a child of `run_arm`): the step gaps, as JSON."""
    clock = StepClock()
    if arm == "hand":
        hand_written(config_path, torch.device(device), clock)
    else:
        trainer(config_path, clock)
    pathlib.Path(result_path).write_text(json.dumps({"arm": arm, "step_ms": clock.gaps_ms()}))
    return 0


def config_for(model: str, steps: int, device: str, run_dir: pathlib.Path):
    """The benchmark's run of ``steps`` steps, on this device's backend, no evaluation."""
    from hpcddp.config import DistConfig

    config = bench_config(MODELS[model], steps)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    return dataclasses.replace(
        config,
        run=dataclasses.replace(config.run, dir=str(run_dir)),
        dist=DistConfig(backend=backend),
        train=dataclasses.replace(config.train, log_every_steps=steps),
    )


def run_arm(arm: str, model: str, steps: int, device: str, work: pathlib.Path) -> float:
    """One fresh process of ``arm``; its median ms/step."""
    from hpcddp.launch.local import free_port

    work.mkdir(parents=True, exist_ok=True)
    config_path, result_path = work / "config.yaml", work / "result.json"
    config_path.write_text(config_for(model, steps, device, work / "run").to_yaml())
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "HPCDDP_DEVICE": device,
    }
    argv = [sys.executable, "-m", "tests.gpu.step_time", "--worker", arm, str(config_path)]
    with open(work / "output.log", "w") as output:
        done = subprocess.run(
            [*argv, str(result_path), device],
            cwd=REPO,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0 or not result_path.exists():
        tail = (work / "output.log").read_text()[-3000:]
        raise SystemExit(f"step_time: the {arm} run failed ({done.returncode}):\n{tail}")
    return run_median_ms(json.loads(result_path.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per arm (default 3)")
    parser.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    parser.add_argument("--model", choices=sorted(MODELS), default="medium")
    parser.add_argument("--device", default="cuda:0", help="cuda:0 (default), or cpu")
    parser.add_argument("--quick", action="store_true", help="1 run, 30 steps: a smoke test")
    parser.add_argument("--worker", nargs=4, metavar=("ARM", "CONFIG", "RESULT", "DEVICE"))
    args = parser.parse_args(argv)
    if args.worker:
        return worker(*args.worker)
    runs, steps = (1, 30) if args.quick else (args.runs, args.steps)
    medians: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="hpcddp-step-time-") as folder:
        for run in range(runs):
            for arm in ARMS:
                work = pathlib.Path(folder) / f"{arm}-{run}"
                medians[arm].append(run_arm(arm, args.model, steps, args.device, work))
    hand, mine = (statistics.median(medians[arm]) for arm in ARMS)
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "CPU"
    print(f"step time on {name}, {args.model} MLP, batch {BATCH_SIZE}, {steps} steps, {runs} runs")
    print(
        f"hand-written DDP {hand:.3f} ms/step, trainer {mine:.3f} ms/step: the trainer runs at "
        f"{hand / mine:.3f}x the hand-written loop's speed"
    )
    for arm in ARMS:
        print(f"  {arm} per run: " + ", ".join(f"{ms:.3f}" for ms in medians[arm]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
