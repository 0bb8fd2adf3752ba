"""How much the trainer costs over a hand-written DDP loop, and checkpoint saves over ``dd``.

Usage::

    python -m tests.benchmarks.training                 # 5 interleaved runs per arm: a few minutes
    python -m tests.benchmarks.training --runs 9 --steps 100 --dir /scratch/$USER/bench
    python -m tests.benchmarks.training --quick         # smoke test: 1 run each, a few steps

Training: every run starts 2 fresh local gloo processes on the CPU (``OMP_NUM_THREADS`` = cores /
2 in both arms) that train one model for a fixed number of steps, either with `Trainer` or with
`hand_written_ddp`, the PyTorch tutorial loop written in the trainer's exact operation order (same
DDP options, PyTorch's own sampler, loss scaling, ``optimizer.step``,
``zero_grad(set_to_none=True)``) with the tutorial's optimizer, ``AdamW(params, lr=...)``, and its
own learning-rate schedule and seeding written from the docs, importing neither from hpcddp. The
trainer's only arithmetic difference is its fused AdamW (``optim.fused``, one pass over the
weights instead of a dozen); tests/local/test_parity.py checks that the same loop given that
optimizer ends in bitwise equal weights, and that with ``optim.fused=false`` the trainer equals
the tutorial loop itself, so the arms differ only in the optimizer kernel and the bookkeeping. The
arms alternate (hand, trainer, hand, ...) so drift in machine load hits both alike. Models: *small*
(273k parameters, the quickstart MLP with 512 hidden units: per-step overhead dominates) and
*medium* (9.5M parameters: compute and the 38 MB gradient all-reduce dominate).

How a step is timed, and why this way: the model factory the benchmark hands to *both* arms
registers a forward pre-hook that records ``time.perf_counter()`` whenever the model starts a
training forward pass. With one micro-batch per step the gap between consecutive forwards is one
full step as the loop runs it: loading the batch, forward, backward with its all-reduce, optimizer
and scheduler steps, zeroing, and whatever bookkeeping the loop does between steps. So the trainer
runs unmodified (no timing code inside it, no extra synchronisation, no per-step logging forced on)
and both arms pay the identical hook cost (about a microsecond). Timestamps from metrics.jsonl
were rejected: they need ``log_every_steps=1``, which adds an all-reduce and ``.item()`` per step.
Per run we take the median gap after the first 10 (warm-up: DDP rebuilds its buckets after the
first step, allocator caches fill), then the median over runs; medians ignore the trainer's
every-10th-step loss all-reduce for logging, so "difference" is the steady-state step overhead
(which does include the trainer's per-step asynchronous stop vote). Run it on an otherwise idle
machine: the per-run medians printed under the table show the spread, and on a busy machine they
vary far more than the few percent being measured.

The stop vote, on the small model: the trainer as it is (a vote about every 0.5 s), with the
vote switched off ("no vote") and with a vote after every step ("vote every step", what the
trainer did before), alternated with the others; the difference with and without is its cost.

Checkpoints have their own benchmark: ``python -m tests.benchmarks.checkpoints``.

Targets: the small model (the quickstart's size) <= 0.97x the hand-written loop, the medium
<= 0.85x; the stop vote <= 0.05 ms a step.
"""

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from hpcddp.comm.group import Leaving, leave_together
from hpcddp.config import (
    Config,
    DataConfig,
    DistConfig,
    FactoryConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
    load_config,
)
from hpcddp.errors import HpcddpError
from hpcddp.launch.local import child_env, free_port

REPO = pathlib.Path(__file__).resolve().parents[2]

MODELS = {  # name: mlp() keyword arguments
    "small": {"in_features": 16, "hidden": 512, "layers": 2, "classes": 4},
    "medium": {"in_features": 16, "hidden": 1024, "layers": 10, "classes": 4},
}
DEFAULT_STEPS = {"small": 200, "medium": 30}
WARMUP_STEPS = 10  # step gaps dropped from the start of every run
BATCH_SIZE = 64  # per rank
NPROC = 2
RUN_TIMEOUT_S = 300.0


# -- what is trained ----------------------------------------------------------------------------


def mlp(
    in_features: int = 16,
    hidden: int = 512,
    layers: int = 2,
    classes: int = 4,
    dropout: float = 0.0,
) -> nn.Module:
    """An MLP classifier with ``layers`` hidden layers (the quickstart model at the defaults)."""
    blocks: list[nn.Module] = []
    for width_in in [in_features] + [hidden] * (layers - 1):
        blocks += [nn.Linear(width_in, hidden), nn.ReLU()]
        blocks += [nn.Dropout(dropout)] if dropout else []
    return nn.Sequential(*blocks, nn.Linear(hidden, classes))


def synthetic_data(
    size: int = 4096, in_features: int = 16, classes: int = 4, seed: int = 1234
) -> TensorDataset:
    """Gaussian inputs labelled by a fixed random linear teacher; a pure function of ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(size, in_features, generator=gen)
    labels = (inputs @ torch.randn(in_features, classes, generator=gen)).argmax(dim=1)
    return TensorDataset(inputs, labels)


def bench_config(model: dict, steps: int, **train: int) -> Config:
    """A run of exactly ``steps`` optimizer steps in one epoch, no evaluation set."""
    size = steps * BATCH_SIZE * NPROC * train.get("grad_accum_steps", 1)
    return Config(
        run=RunConfig(seed=0, resume=False),
        model=FactoryConfig(factory="tests.benchmarks.training:mlp", kwargs=dict(model)),
        data=DataConfig(
            factory="tests.benchmarks.training:synthetic_data",
            batch_size=BATCH_SIZE,
            num_workers=0,
            kwargs={"size": size, "in_features": model["in_features"], "classes": model["classes"]},
        ),
        optim=OptimConfig(lr=1e-3, warmup_steps=min(10, steps)),
        train=TrainConfig(max_steps=steps, **train),
        dist=DistConfig(backend="gloo"),
    )


# -- the baseline -------------------------------------------------------------------------------


def warmup_then_cosine(step: int, opt: OptimConfig, total_steps: int) -> float:
    """The fraction of ``optim.lr`` that optimizer step ``step`` (1, 2, ...) uses, as documented.

    ``optim.warmup_steps``: linear warmup from 0 to lr, so step k of W uses k/W of it; then
    ``optim.schedule=cosine`` decays over the remaining steps towards ``optim.min_lr_ratio``,
    reached where the step after the run's last would be (``constant``: lr). Written from the
    docs (docs/configuration.md), not from hpcddp's code.
    """
    if step <= opt.warmup_steps:
        return step / opt.warmup_steps
    if opt.schedule == "constant":
        return 1.0
    done = (step - 1 - opt.warmup_steps) / max(total_steps - opt.warmup_steps, 1)
    floor = opt.min_lr_ratio
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))


def hand_written_ddp(
    model_fn: Callable[..., nn.Module],
    dataset_fn: Callable[..., TensorDataset],
    config: Config,
    rank: int,
    world_size: int,
    fused: bool = False,
) -> tuple[nn.Module, int]:
    """The tutorial DDP loop in the trainer's operation order; returns (model, steps taken).

    Mirrors what the benchmark and tests/local/test_parity.py configure (fp32, AdamW, no gradient
    clipping, no compile); expects MASTER_ADDR and MASTER_PORT in the environment (``env://``).
    ``fused=False`` is the tutorial's ``AdamW(params, lr=...)``, PyTorch's default (a loop of
    element-wise operations on CPU): the baseline the benchmark times. ``fused=True`` is the
    same loop with the optimizer the trainer uses by default (``optim.fused``): op for op the
    trainer's arithmetic, which the parity test compares bit for bit.
    """
    seed, data, train, opt = config.run.seed, config.data, config.train, config.optim
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)
    torch.manual_seed(seed)  # run.seed: identical initial weights on every rank
    model = model_fn(**config.model.kwargs)
    dataset = dataset_fn(**data.kwargs)
    ddp = DDP(model, gradient_as_bucket_view=True)  # as the trainer's DistConfig defaults
    sampler = DistributedSampler(
        dataset, world_size, rank, shuffle=data.shuffle, seed=seed, drop_last=data.drop_last
    )
    loader = DataLoader(
        dataset,
        batch_size=data.batch_size,
        sampler=sampler,
        drop_last=data.drop_last,
        generator=torch.Generator(),  # so creating the iterator never draws from the global RNG
    )
    accum = train.grad_accum_steps
    total_steps = train.max_steps or train.epochs * math.ceil(len(loader) / accum)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=opt.lr,
        weight_decay=opt.weight_decay,
        fused=True if fused else None,
    )
    torch.manual_seed(seed + rank)  # run.seed + rank: each rank's own dropout stream
    step = 0
    for epoch in range(train.epochs):
        sampler.set_epoch(epoch)
        for i, (inputs, targets) in enumerate(loader):
            window = min(accum, len(loader) - i // accum * accum)  # the last may be shorter
            last = i % accum == window - 1  # gradients are all-reduced on the last only
            with contextlib.nullcontext() if last else ddp.no_sync():
                loss = F.cross_entropy(ddp(inputs), targets) / window
                loss.backward()
            if last:
                step += 1
                for group in optimizer.param_groups:
                    group["lr"] = opt.lr * warmup_then_cosine(step, opt, total_steps)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if step == total_steps:
                break
        if step == total_steps:
            break
    # Leave as the trainer does: rank 0 serves the rendezvous store, so it leaves last (a plain
    # barrier + destroy_process_group sometimes aborts a rank that is still tearing down).
    leave_together(Leaving.FINISHED)
    return model, step


# -- one run: two processes ---------------------------------------------------------------------


class StepClock:
    """Records when the model starts each training forward pass (a forward pre-hook)."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def attach(self, model: nn.Module) -> nn.Module:
        """Hook ``model`` and return it."""
        model.register_forward_pre_hook(self._tick)
        return model

    def _tick(self, module: nn.Module, args) -> None:
        if module.training:  # evaluation passes are not steps
            self.starts.append(time.perf_counter())

    def gaps_ms(self) -> list[float]:
        """Milliseconds between consecutive training forwards: one step each."""
        return [(b - a) * 1e3 for a, b in itertools.pairwise(self.starts)]


def worker(arm: str, config_path: str, result_path: str) -> int:
    """One rank of one run (a child of `run_pair`); rank 0 writes the result as JSON."""
    from hpcddp.launch.resolve import resolve_env
    from hpcddp.train.factories import import_factory
    from hpcddp.train.state import weights_sha256
    from hpcddp.train.trainer import Trainer

    env, config, clock = resolve_env(), load_config(config_path), StepClock()
    factory = import_factory(config.model.factory, "model")
    dataset_fn = import_factory(config.data.factory, "data")
    model_fn = lambda **kwargs: clock.attach(factory(**kwargs))  # noqa: E731
    if arm.startswith("trainer"):
        _set_vote(arm)
        summary = Trainer(model_fn, dataset_fn, config).fit(env).summary
        digest, steps = summary.weights_sha256, summary.steps
    else:
        fused = arm == "identical" and config.optim.fused
        model, steps = hand_written_ddp(
            model_fn, dataset_fn, config, env.rank, env.world_size, fused=fused
        )
        digest = weights_sha256(model)
    if env.is_main:
        pathlib.Path(result_path).write_text(
            json.dumps(
                {
                    "arm": arm,
                    "weights_sha256": digest,
                    "steps": steps,
                    "step_ms": clock.gaps_ms(),
                    **({"vote": VOTE_TIME} if arm.startswith("trainer") else {}),
                }
            )
        )
    return 0


VOTE_ARMS = {"trainer-no-vote": False, "trainer-vote-every-step": True}


VOTE_TIME = {"votes": 0, "ms": 0.0}  # time the main thread spent casting and reading votes


def _set_vote(arm: str) -> None:
    """The vote as configured ("trainer"), never, or after every step (as it used to be);
    the time spent in ``cast`` and ``result`` is added up in `VOTE_TIME`."""
    from hpcddp.train.preemption import StopVote

    if arm in VOTE_ARMS:
        every_step = VOTE_ARMS[arm]
        StopVote.due = lambda self, step: every_step and not self.pending  # type: ignore
    for name in ("cast", "result"):
        setattr(StopVote, name, _timed(getattr(StopVote, name), name == "cast"))


def _timed(method, counts: bool):
    def timed(self, *args):
        started = time.perf_counter()
        try:
            return method(self, *args)
        finally:
            VOTE_TIME["ms"] += (time.perf_counter() - started) * 1e3
            VOTE_TIME["votes"] += counts

    return timed


def run_pair(arm: str, config: Config, work_dir: pathlib.Path) -> dict:
    """Train with ``arm`` in NPROC local gloo processes; rank 0's result. Arms: "trainer",
    "hand" (the tutorial loop) and "identical" (the tutorial loop with the trainer's optimizer)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    config = dataclasses.replace(
        config, run=dataclasses.replace(config.run, dir=str(work_dir / "run"))
    )
    config_path, result_path = work_dir / "config.yaml", work_dir / "result.json"
    config_path.write_text(config.to_yaml())
    base = {
        **os.environ,
        "OMP_NUM_THREADS": str(max((os.cpu_count() or 1) // NPROC, 1)),
        "HPCDDP_DEVICE": "cpu",
        "HPCDDP_BACKEND": "gloo",
    }
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "tests.benchmarks.training",
        "--worker",
        arm,
        str(config_path),
        str(result_path),
    ]
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(open(work_dir / f"rank-{r}.log", "w")) for r in range(NPROC)]
        procs = [
            subprocess.Popen(
                command,
                env=child_env(r, NPROC, port, base),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
            for r, log in enumerate(logs)
        ]
        codes = _wait_all(procs, RUN_TIMEOUT_S)
    if any(codes) or not result_path.exists():
        raise HpcddpError(
            f"benchmark run '{arm}' failed with exit codes {codes}; expected 0 "
            f"from every rank. HINT: read {work_dir}/rank-*.log."
        )
    return json.loads(result_path.read_text())


def _wait_all(procs: list[subprocess.Popen], timeout_s: float) -> list[int]:
    """Exit codes; on the first failure (or the timeout) the others are killed, not left hanging."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs):
        if any(p.poll() for p in procs) or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    return [p.wait() for p in procs]


# -- measurements -------------------------------------------------------------------------------


def run_median_ms(result: dict) -> float:
    """Median step time of one run, warm-up steps dropped."""
    gaps = result["step_ms"]
    return statistics.median(gaps[min(WARMUP_STEPS, len(gaps) // 2) :])


def time_training(
    model: str, steps: int, runs: int, work_dir: pathlib.Path, arms: tuple[str, ...]
) -> dict:
    """Alternate the arms' runs; median over runs of per-run medians (ms/step)."""
    config = bench_config(MODELS[model], steps)
    medians: dict[str, list[float]] = {arm: [] for arm in arms}
    votes: list[tuple[int, float, int]] = []
    for run in range(runs):
        for arm in medians:
            result = run_pair(arm, config, work_dir / f"{model}-{arm}-{run}")
            medians[arm].append(run_median_ms(result))
            if arm == "trainer":
                votes.append((result["vote"]["votes"], result["vote"]["ms"], result["steps"]))
            shutil.rmtree(work_dir / f"{model}-{arm}-{run}", ignore_errors=True)
    params = sum(p.numel() for p in mlp(**MODELS[model]).parameters())
    return {
        "model": model,
        "params": params,
        "runs": medians,
        "votes": votes,
        **{arm: statistics.median(m) for arm, m in medians.items()},
    }


# -- report -------------------------------------------------------------------------------------


def format_report(rows: list[dict]) -> str:
    """The results as a plain-text table."""
    lines = [
        f"{'model':<8}{'params':>12}{'hand-written ms/step':>22}{'trainer ms/step':>17}"
        f"{'difference ms':>15}{'ratio':>8}"
    ]
    for r in rows:
        lines.append(
            f"{r['model']:<8}{r['params']:>12,}{r['hand']:>22.3f}{r['trainer']:>17.3f}"
            f"{r['trainer'] - r['hand']:>+15.3f}{r['trainer'] / r['hand']:>8.3f}"
        )
    vote = rows[0]
    held = sum(v[0] for v in vote["votes"])
    spent_ms, steps = sum(v[1] for v in vote["votes"]), sum(v[2] for v in vote["votes"])
    lines += [
        "",
        f"stop vote ({vote['model']} model): {held} votes in {steps} steps (one every "
        f"{steps / max(held, 1):.0f}), {spent_ms / max(held, 1):.3f} ms each in cast + result: "
        f"{spent_ms / max(steps, 1):.4f} ms/step",
    ]
    if all(arm in vote for arm in VOTE_ARMS):
        lines += [
            f"step medians, ms/step: vote every ~0.5 s {vote['trainer']:.3f}, "
            f"none {vote['trainer-no-vote']:.3f}, every step {vote['trainer-vote-every-step']:.3f}",
            f"  cost of the vote: {vote['trainer'] - vote['trainer-no-vote']:+.3f} ms/step "
            f"(every step: {vote['trainer-vote-every-step'] - vote['trainer-no-vote']:+.3f})",
        ]
    lines += ["", "per-run medians, ms/step (the spread shows how noisy this machine is):"]
    lines += [
        f"  {r['model']:<7} {arm:<24} {' '.join(f'{v:.3f}' for v in r['runs'][arm])}"
        for r in rows
        for arm in r["runs"]
    ]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.training", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runs", type=int, default=5, help="runs per arm and model (default 5)")
    parser.add_argument(
        "--steps",
        type=int,
        default=0,
        help="steps per run for both models (default: small 200, medium 30)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 1 run each, 12 steps; the figures mean nothing",
    )
    parser.add_argument(
        "--dir", default=None, help="where runs and checkpoints are written (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < 0:
        parser.error("--runs must be >= 1 and --steps >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:  # a child process started by run_pair
        return worker(*argv[1:])
    args = parse_args(argv)
    runs = 1 if args.quick else args.runs
    with tempfile.TemporaryDirectory(prefix="hpcddp-bench-", dir=args.dir) as tmp:
        work_dir = pathlib.Path(tmp)
        rows = [
            time_training(
                m,
                args.steps or (12 if args.quick else DEFAULT_STEPS[m]),
                runs,
                work_dir,
                ("hand", "trainer", *(VOTE_ARMS if m == "small" else ())),
            )
            for m in MODELS
        ]
    print(format_report(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
