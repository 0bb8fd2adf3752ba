"""The training loop of one rank: resume, accumulation windows, evaluation, checkpoints, stops.

`TrainingRun.execute` reads top to bottom: resume from the latest complete checkpoint, train
in accumulation windows (gradients sync on the last micro-batch only), evaluate and checkpoint
on schedule, stop cleanly when the ranks agree to, and finish with a summary every rank agrees
on. The run is made of parts that each do one job: `hpcddp.train.assembly` builds them,
`hpcddp.train.stopping` decides stops and requeues, `hpcddp.train.guard` holds the NaN policy,
`hpcddp.train.ending` finishes. What only watches or tells (notices, the hang watchdog,
telemetry, metrics.jsonl, the log and bar, the timeline) is a hook (`hpcddp.train.hooks`): a new
side concern adds a hook, not lines here. Rank discipline is visible where it happens: files
and prints under ``is_main``; every rank reaches every collective.
"""

import faulthandler
import logging
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hpcddp.comm import failures
from hpcddp.launch import collector
from hpcddp.launch.distenv import DistEnv
from hpcddp.outcome import RunOutcome, StopReason
from hpcddp.run_files import rank_log
from hpcddp.train import batches, data, ddp, ending, evaluation, flops, preemption, rng, usercode
from hpcddp.train.assembly import Parts, RunSetting, assemble, attach
from hpcddp.train.hooks import Hook, Hooks, Stepped
from hpcddp.train.state import Progress
from hpcddp.train.stopping import Stopping
from hpcddp.train.timeline import since_process_start

log = logging.getLogger(__name__)


class TrainingRun:
    """One process's side of a training run: its parts, its stop decisions, its hooks, the loop."""

    def __init__(self, parts: Parts, stopping: Stopping, hooks: Hooks, setting: RunSetting) -> None:
        self.parts, self.stopping, self.hooks = parts, stopping, hooks
        self.cfg, self.env, self.device = setting.cfg, setting.env, setting.device
        self.run_dir, self.timeline, self.setting = setting.run_dir, setting.timeline, setting
        self.progress = Progress()
        self.buffers_ready = False  # rank 0's snapshot buffers, allocated after the first step
        self.last_eval: dict[str, float] | None = None

    def execute(self) -> RunOutcome:
        """Resume, train to the end (or a clean stop), then summarize."""
        try:
            self.progress = _started(self.parts, self.stopping, self.setting)
            self.stopping.read_deadline()  # rank 0 asks Slurm; a job too short is refused
            self.hooks.on_start(self.progress)
            reason = self._train()
            self.hooks.on_train_end(self.progress, reason)
            outcome = self._end(reason)
            self.hooks.on_end(outcome)
            return outcome
        except Exception as err:
            explained = _explained(err, self.env, self.cfg.dist.timeout_s, self.run_dir)
            self.hooks.on_failure(explained, self.progress.step)
            if explained is err:
                raise
            raise explained from err
        finally:
            self.hooks.close()

    def _train(self) -> StopReason | None:
        """Epochs of accumulation windows; a stop reason if stopped early (checkpoint saved)."""
        t, progress = self.cfg.train, self.progress
        # max_steps, when set, decides alone: epochs then only count passes over the data
        while progress.step < self.parts.total_steps and (t.max_steps or progress.epoch < t.epochs):
            loader = self.parts.train_loader
            at = progress.batch, progress.samples_before  # where this epoch resumes
            data.start_epoch(loader, progress.epoch, self.cfg.run.seed, *at)
            batches_left = iter(loader), len(loader)
            reason = self._epoch(*batches_left)
            if reason:
                return reason
        return None

    def _epoch(self, loader: Any, left: int) -> StopReason | None:
        """The accumulation windows left in this epoch; a stop reason if stopped early."""
        t, progress, parts = self.cfg.train, self.progress, self.parts
        while left > 0 and progress.step < parts.total_steps:
            window = min(t.grad_accum_steps, left)
            started = time.perf_counter()
            logging_next = (progress.step + 1) % t.log_every_steps == 0
            loss, seen = parts.stepper.step(loader, window, progress.step + 1, logging_next)
            seconds = time.perf_counter() - started
            left -= window
            progress.batch += window
            progress.step += 1
            if progress.step == self.stopping.resumed_step + 1 and self.env.is_main:
                self.stopping.record_start()
            if parts.guard.judge(seen, progress, self._scale):
                return StopReason.NONFINITE
            if not self.buffers_ready:  # the optimizer has its state now
                parts.checkpoints.prepare()  # host buffers for the first background save
                self.buffers_ready = True
            reason = self._after_step(loss, seconds, epoch_done=left == 0)
            if reason:
                return reason
        if left == 0:  # not when max_steps ended the run inside the epoch
            progress.next_epoch()
        return None

    def _after_step(
        self, loss: torch.Tensor, seconds: float, epoch_done: bool
    ) -> StopReason | None:
        """Tell the hooks, evaluate and checkpoint on schedule; a stop reason to stop now."""
        parts, t, step = self.parts, self.cfg.train, self.progress.step
        last = step == parts.total_steps
        reason = self.stopping.reason(step, last)
        logged = step % t.log_every_steps == 0 or epoch_done or last or reason is not None
        lr = float(parts.scheduler.get_last_lr()[0])
        if logged:  # the loss every rank agrees on, and the fp16 scale: sync points
            self.progress.last_loss = _mean_over_ranks(loss, self.env)
        scale = self._scale() if logged else None
        self.hooks.on_step(Stepped(self.progress, seconds, logged, reason, lr, scale))
        if _due(t.eval_every_steps, step, epoch_done, last):
            self._evaluate()
            parts.vote.restart(step)
        if _due(t.checkpoint_every_steps, step, epoch_done, last) or reason:
            # CUDA reads the guard a step late: never save a bad step
            if parts.guard.judge(parts.guard.settle(), self.progress, self._scale):
                return StopReason.NONFINITE
            with self.hooks.outside_steps("checkpoint"):
                parts.checkpoints.save(self.progress, epoch_done)
            parts.vote.restart(step)
        return reason

    def _scale(self) -> float | None:
        """fp16: GradScaler's current loss scale (a sync point: only when logged or judged)."""
        scaler = self.parts.stepper.scaler
        return scaler.get_scale() if scaler is not None else None

    def _evaluate(self, record: bool = True) -> dict[str, float] | None:
        """The task's metrics over the eval set (every rank its shard), told to the hooks."""
        parts = self.parts
        if parts.eval_loader is None:
            return None
        with self.hooks.outside_steps("evaluation"):
            ddp.sync_buffers(parts.model)
            result = evaluation.evaluate(
                parts.model, parts.eval_loader, parts.task, self.device, self.cfg.train.precision
            )
        self.last_eval = result
        self.hooks.on_evaluation(self.progress, result, record)
        return result

    def _end(self, reason: StopReason | None) -> RunOutcome:
        """Drain what is in flight, then finish, conclude a stop, or refuse a non-finite run."""
        parts = self.parts
        parts.vote.result()  # drain the last vote so no collective is left in flight
        with self.timeline.phase("checkpoint"):
            parts.checkpoints.wait()  # a write still in the background is part of the run
        if reason == StopReason.NONFINITE:
            latest = parts.checkpoints.store.latest_step()
            ending.refuse_nonfinite(
                parts.guard, latest, parts.hosts, self.env, self.progress, self.run_dir
            )
        if reason:
            self.hooks.on_stop(self.progress, reason)  # before a requeue ends this process
            return self.stopping.conclude(reason, self.progress.step)
        evaluated = self.last_eval
        if evaluated is None and parts.eval_loader is not None:
            # a re-run of a finished run: same weights, same metrics
            evaluated = self._evaluate(record=False)
        return ending.finish(
            parts.model, self.env, self.progress, self.stopping, self.timeline, evaluated
        )


def assembled(
    model_fn: Callable[..., torch.nn.Module],
    dataset_fn: Callable[..., Any],
    setting: RunSetting,
    stop_flag: preemption.StopFlag,
    side: Sequence[Hook],
) -> TrainingRun:
    """A rank's run, its parts built and its side concerns attached: hpcddp's own, then
    ``side`` (the notices, and any hooks the user gave the trainer).

    ``stop_flag`` is the caller's, for the whole run: a signal during set-up is a clean stop.
    """
    parts = assemble(model_fn, dataset_fn, setting)
    stopping = Stopping(
        setting.cfg, setting.env, stop_flag, parts.vote, setting.attempt, setting.run_dir
    )
    hooks = attach(setting, parts.written, parts.total_steps, side)
    return TrainingRun(parts, stopping, hooks, setting)


def _started(parts: Parts, stopping: Stopping, setting: RunSetting) -> Progress:
    """Start-up: DDP's buckets settled, then where training stands: the latest checkpoint's.

    Without a checkpoint each rank starts its own random stream. With run.resume=false the run
    directory was found empty, or moved aside, or holds an earlier attempt of this same job
    (`hpcddp.records.rundir`): what is there is ours.
    """
    _settle_buckets(parts, setting)  # before resume: its forward may draw random numbers
    resumed = parts.checkpoints.resume()
    stopping.resumed_step = resumed.step if resumed else 0
    if resumed is None:
        rng.seed_everything(setting.cfg.run.seed + setting.env.rank)  # own dropout stream
    stopping.started = {
        "started": round(time.time() - since_process_start(), 3),
        "loaded": round(time.time(), 3),
    }
    collector.resume()  # start-up is over; the collectives after it line the ranks up
    return resumed or Progress()


def _settle_buckets(parts: Parts, setting: RunSetting) -> None:
    """DDP's bucket layout fixed (and FLOPs counted, the guard's probe found) before step 1."""
    t = setting.cfg.train
    first = ddp.first_batch(parts.train_loader.dataset, setting.cfg.data.batch_size)
    with (
        setting.timeline.phase("buckets"),
        flops.counting(t.count_flops and not t.compile) as counted,
        parts.guard.find_probe(parts.model),
    ):
        on_device = batches.to_device(first, setting.device)
        ddp.settle_buckets(parts.ddp, parts.model, on_device, t.precision, parts.task)
    parts.written.flops_per_sample = counted() / max(batches.size_of(first), 1)


def _explained(
    err: Exception, env: DistEnv, timeout_s: float, run_dir: pathlib.Path
) -> BaseException:
    """What the run fails with: a peer's fault or the user's code named; every thread's stack
    in the rank's log, for post-mortems."""
    with rank_log(run_dir, env.rank).open("a") as log_file:
        faulthandler.dump_traceback(log_file)
    explained = failures.explain(err, env, timeout_s)
    return usercode.blame(explained, env, "your code in training")


def _mean_over_ranks(loss: torch.Tensor, env: DistEnv) -> float:
    """The step's loss averaged over the ranks (an all-reduce: only on logged steps)."""
    if env.distributed:
        nccl = env.backend == "nccl"
        dist.all_reduce(loss, op=dist.ReduceOp.AVG if nccl else dist.ReduceOp.SUM)
        loss = loss if nccl else loss / env.world_size
    return float(loss.item())


def _due(every: int, step: int, epoch_done: bool, last: bool) -> bool:
    """Every ``every`` steps, or at each epoch's end when ``every`` is 0; always at the end."""
    return bool(every and step % every == 0) or (not every and epoch_done) or last
