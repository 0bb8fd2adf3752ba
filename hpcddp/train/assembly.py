"""Everything one rank's run is made of, built in the one order every rank must follow.

`assemble` builds model, data, DDP, optimizer, scaler, guard, stepper, checkpointer and the
side groups; `hpcddp.train.loop` only runs them. The side groups are made by collectives, so
every rank makes them here, at the same point and in the same order. `attach` gives the loop
its side concerns as hooks (`hpcddp.train.hooks`), in the order each moment meets them.
"""

import dataclasses
import math
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hpcddp.config import Config
from hpcddp.errors import ConfigError
from hpcddp.launch.distenv import DistEnv
from hpcddp.records import attempts
from hpcddp.records.rundir import Attempt
from hpcddp.train import building, data, ddp, guard, preemption, strategy, telemetry
from hpcddp.train.checkpointing import Checkpointer, Trained
from hpcddp.train.hang_watch import HangWatch
from hpcddp.train.hooks import Hook, Hooks
from hpcddp.train.metrics_writer import MetricsWriter
from hpcddp.train.optim import make_optimizer, make_scheduler
from hpcddp.train.progress_log import ProgressLog
from hpcddp.train.sharded_checkpointing import ShardedCheckpointer
from hpcddp.train.stepping import Stepper
from hpcddp.train.task import Task
from hpcddp.train.timeline import Timeline


@dataclasses.dataclass(frozen=True)
class RunSetting:
    """Where one rank's run takes place: its config, its place in the job, its directory."""

    cfg: Config
    env: DistEnv
    device: torch.device
    run_dir: pathlib.Path
    attempt: Attempt
    timeline: Timeline


@dataclasses.dataclass
class Parts:
    """One rank's model, data, optimizer and the helpers that step, guard, save and vote."""

    model: torch.nn.Module  # unwrapped: what is optimized, saved and evaluated
    ddp: torch.nn.Module  # what runs the training forward (`hpcddp.train.strategy.Wrapped`)
    train_loader: Any
    eval_loader: Any
    total_steps: int
    task: Task
    scheduler: torch.optim.lr_scheduler.LRScheduler
    guard: guard.Guard
    clock: telemetry.IntervalClock
    stepper: Stepper
    checkpoints: Checkpointer | ShardedCheckpointer
    vote: preemption.StopVote
    written: MetricsWriter
    hosts: list[str]


def assemble(
    model_fn: Callable[..., torch.nn.Module],
    dataset_fn: Callable[..., Any],
    setting: RunSetting,
) -> Parts:
    """Build a rank's parts; a fault on one rank ends them all (they agree before DDP)."""
    cfg, env, device, run_dir = setting.cfg, setting.env, setting.device, setting.run_dir
    built = building.build(model_fn, dataset_fn, cfg, env, device)
    total_steps = _total_steps(built.train_loader, cfg, env)
    spread = strategy.of(cfg)  # dist.strategy: how the model is wrapped, saved, loaded
    wrapped = spread.wrap(built.model, cfg, env, device)
    model = wrapped.model
    task = Task.resolve(cfg.task, model)
    optimizer = make_optimizer(model.parameters(), cfg.optim)
    scheduler = make_scheduler(optimizer, cfg.optim, total_steps)
    scaler = ddp.make_scaler(cfg.train.precision, device)
    nan_guard = guard.Guard(
        cfg.train, device.type, scaled=scaler is not None, distributed=env.distributed
    )
    clock = telemetry.IntervalClock(device)
    stepper = Stepper(
        cfg, device, wrapped, optimizer, scheduler, scaler, task, nan_guard, clock, spread
    )
    trained = Trained(model, optimizer, scheduler, scaler)
    checkpoints = spread.checkpointer(run_dir, cfg, env, trained)
    vote = preemption.StopVote(env.backend, env.distributed, timeout_s=cfg.dist.timeout_s)
    written = MetricsWriter(cfg, env, device, built.hosts, clock, run_dir)  # a side group
    return Parts(
        model=model,
        ddp=wrapped.forward,
        train_loader=built.train_loader,
        eval_loader=built.eval_loader,
        total_steps=total_steps,
        task=task,
        scheduler=scheduler,
        guard=nan_guard,
        clock=clock,
        stepper=stepper,
        checkpoints=checkpoints,
        vote=vote,
        written=written,
        hosts=built.hosts,
    )


def attach(
    setting: RunSetting, written: MetricsWriter, total_steps: int, side: Sequence[Hook]
) -> Hooks:
    """The run's side concerns, in the order each moment meets them: the start-up timeline,
    metrics.jsonl (opened before the step clock restarts, drained before the watchdog stops),
    the step clock, the hang watchdog, the log and the bar; then ``side`` (the notices first,
    told of a start once the files are open; hooks of the user's)."""
    attempt = setting.attempt
    stacks = attempts.hang_dir(setting.run_dir, attempt.job, attempt.restart)
    return Hooks(
        [
            setting.timeline,
            written,
            written.clock,
            HangWatch(setting.cfg.dist, setting.env, stacks, attempt.restart),
            ProgressLog(setting.env, written, total_steps),
            *side,
        ]
    )


def _total_steps(train_loader: Any, cfg: Config, env: DistEnv) -> int:
    """Optimizer steps in the run: train.max_steps, or epochs of accumulation windows."""
    steps_per_epoch = math.ceil(len(train_loader) / cfg.train.grad_accum_steps)
    if steps_per_epoch == 0:  # every rank gets the same number of samples
        per_rank = data.samples_per_rank(train_loader)
        raise ConfigError(
            f"the training set gives each rank {per_rank} samples, not one batch "
            f"(data.batch_size={cfg.data.batch_size}, data.drop_last=true, world size "
            f"{env.world_size}). HINT: lower data.batch_size or set data.drop_last=false."
        )
    return cfg.train.max_steps or cfg.train.epochs * steps_per_epoch
