"""The training loop of one rank: resume, accumulation windows, evaluation, checkpoints, stops.

`TrainingRun.execute` reads top to bottom: resume from the latest complete checkpoint, train
in accumulation windows (gradients sync on the last micro-batch only), evaluate and checkpoint
on schedule, stop cleanly when the ranks agree to, and finish with a summary every rank agrees
on. Rank discipline is visible where it happens: files and prints under ``is_main``; every rank
reaches every collective.
"""

import contextlib
import dataclasses
import faulthandler
import json
import logging
import math
import os
import pathlib
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hpcddp import collective, data, ddp, evaluation, failures, preemption, rng, rundir
from hpcddp.atomic import atomic_write_text
from hpcddp.checkpoint import CheckpointStore
from hpcddp.config import Config
from hpcddp.environments import DistEnv
from hpcddp.errors import ConfigError, DistributedError
from hpcddp.optim import make_optimizer, make_scheduler
from hpcddp.progress import ProgressBar, bar
from hpcddp.weights import weights_sha256

log = logging.getLogger(__name__)


def split_datasets(made: Any) -> tuple[Any, Any]:
    """A dataset factory returns ``train`` or ``(train, eval)`` or ``{"train":..., "eval":...}``."""
    if isinstance(made, dict):
        return made["train"], made.get("eval")
    if isinstance(made, (tuple, list)):
        return made[0], made[1] if len(made) > 1 else None
    return made, None


@dataclasses.dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0
    batch: int = 0  # micro-batches of this epoch already consumed
    last_loss: float = float("nan")


class TrainingRun:
    """One process's side of a training run: the model, data and optimizer, and the loop."""

    def __init__(self, model_fn: Callable, dataset_fn: Callable, cfg: Config, env: DistEnv,
                 device: torch.device, run_dir: pathlib.Path) -> None:
        self.cfg, self.env, self.device, self.run_dir = cfg, env, device, run_dir
        rng.seed_everything(cfg.run.seed)  # identical initial weights on every rank
        model = model_fn(**cfg.model.kwargs).to(device)
        train_set, eval_set = split_datasets(dataset_fn(**cfg.data.kwargs))
        self.train_loader = data.make_train_loader(train_set, cfg.data, env, cfg.run.seed)
        self.eval_loader = None if eval_set is None else data.make_eval_loader(
            eval_set, cfg.data, env)
        self.steps_per_epoch = math.ceil(len(self.train_loader) / cfg.train.grad_accum_steps)
        if self.steps_per_epoch == 0:
            raise ConfigError(f"the training set gives rank {env.rank} no batch "
                              f"(data.batch_size={cfg.data.batch_size}, world size "
                              f"{env.world_size}). HINT: lower data.batch_size or drop_last.")
        self.total_steps = cfg.train.max_steps or cfg.train.epochs * self.steps_per_epoch
        self.model, self.ddp = ddp.wrap(model, cfg, env, device)
        self.loss_fn = getattr(self.model, "compute_loss", ddp.default_loss)
        self.optimizer = make_optimizer(self.model.parameters(), cfg.optim)
        self.scheduler = make_scheduler(self.optimizer, cfg.optim, self.total_steps)
        self.scaler = ddp.make_scaler(cfg.train.precision)
        self.store = CheckpointStore(run_dir, keep_last=cfg.train.keep_checkpoints)
        self.progress = Progress()

    # -- the loop ---------------------------------------------------------------------------

    def execute(self, stop_flag: preemption.StopFlag) -> dict:
        """Resume, train to the end (or a clean stop), then summarize.

        ``stop_flag`` is installed by the caller for the whole run, so a stop signal that comes
        during set-up or teardown is recorded instead of killing the process.
        """
        self.stop_flag, self.metrics = stop_flag, None
        self.bar = ProgressBar(enabled=self.env.is_main)
        try:
            # before resume: its forward may read the dataset, which may draw random numbers
            ddp.settle_buckets(self.ddp, self.model, self.train_loader.dataset,
                               self.cfg.data.batch_size, self.device, self.cfg.train.precision)
            self._resume()
            if self.progress.step == 0:
                rng.seed_everything(self.cfg.run.seed + self.env.rank)  # own dropout stream
            collective.on_rank_zero(self._open_metrics, self.env.rank, "open metrics.jsonl")
            self.deadline = self._deadline()
            self.vote = preemption.StopVote(self.env.backend, self.env.distributed)
            reason = self._train()
            self.vote.result()  # drain the last vote so no collective is left in flight
            return self._stopped(reason) if reason else self._finish()
        except Exception as err:
            with (self.run_dir / "logs" / f"rank-{self.env.rank}.log").open("a") as log_file:
                faulthandler.dump_traceback(log_file)  # every thread's stack, for post-mortems
            explained = failures.explain(err, self.env, self.cfg.dist.timeout_s)
            if explained is err:
                raise
            raise explained from err
        finally:
            self.bar.close()
            if self.metrics:
                self.metrics.close()

    def _open_metrics(self) -> None:
        """Rank 0's metrics.jsonl, forgetting lines past the checkpoint it resumed from."""
        self.metrics = rundir.MetricsLog(self.run_dir / "metrics.jsonl", self.progress.step)

    def _deadline(self) -> float | None:
        """When to stop on our own, ahead of the job's time limit (rank 0 asks Slurm)."""
        end = preemption.job_end_time(os.environ) if self.env.is_main else None
        end = collective.broadcast_object(end)
        return None if end is None else end - self.cfg.train.stop_before_end_s

    def _stopped(self, reason: int) -> dict:
        """After the stop checkpoint: requeue a preempted Slurm job (rank 0) and report."""
        outcome = {"stopped": True, "step": self.progress.step,
                   "reason": preemption.REASON_NAMES[reason]}
        if reason == preemption.STOP_PREEMPTED:
            requeued, message = collective.on_rank_zero(preemption.requeue, self.env.rank,
                                                        "requeue the job")
            outcome["requeued"] = requeued
            (log.info if requeued else log.error)(
                "preempted at step %d, checkpoint saved; %s", self.progress.step, message)
        return outcome

    def _train(self) -> int:
        """Epochs of accumulation windows; a stop reason if stopped early (checkpoint saved)."""
        t = self.cfg.train
        # max_steps, when set, decides alone: epochs then only count passes over the data
        while self.progress.step < self.total_steps and (
                t.max_steps or self.progress.epoch < t.epochs):
            data.start_epoch(self.train_loader, self.progress.epoch, self.cfg.run.seed,
                             skip_batches=self.progress.batch)
            batches, left = iter(self.train_loader), len(self.train_loader)
            self._tick, self._tick_step = time.perf_counter(), self.progress.step
            while left > 0 and self.progress.step < self.total_steps:
                window = min(t.grad_accum_steps, left)
                loss = self._step(batches, window)
                left -= window
                self.progress.batch += window
                self.progress.step += 1
                reason = self._after_step(loss, epoch_done=left == 0)
                if reason:
                    return reason
                if self.bar.drawing:
                    self._draw_bar()
            if left == 0:  # not when max_steps ended the run inside the epoch
                self.progress.epoch += 1
                self.progress.batch = 0
        return preemption.CARRY_ON

    def _draw_bar(self) -> None:
        """Rank 0's terminal line; the loss is the last logged one (no sync here)."""
        loss = self.progress.last_loss
        self.bar.update(f"{bar(self.progress.step, self.total_steps)} step "
                        f"{self.progress.step}/{self.total_steps} epoch {self.progress.epoch} "
                        f"loss {'-' if math.isnan(loss) else f'{loss:.4f}'}")

    def _step(self, batches, window: int) -> torch.Tensor:
        """One optimizer step over ``window`` micro-batches; gradients sync on the last only."""
        total = torch.zeros((), device=self.device)
        for i in range(window):
            inputs, targets = (x.to(self.device, non_blocking=True) for x in next(batches))
            sync = contextlib.nullcontext() if i == window - 1 else self.ddp.no_sync()
            with sync:
                with ddp.autocast(self.cfg.train.precision, self.device):
                    loss = self.loss_fn(self.ddp(inputs), targets) / window
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
        self._optimizer_step()
        return total

    def _optimizer_step(self) -> None:
        clip = self.cfg.optim.grad_clip_norm
        if self.scaler:
            if clip:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            if clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _after_step(self, loss: torch.Tensor, epoch_done: bool) -> int:
        """Log, evaluate and checkpoint on schedule; a stop reason when the run must stop now."""
        t, step = self.cfg.train, self.progress.step
        last = step == self.total_steps
        reason = self._stop_reason(last)
        if step % t.log_every_steps == 0 or epoch_done or last or reason:
            self._log_step(loss)
        if (t.eval_every_steps and step % t.eval_every_steps == 0) or (
                not t.eval_every_steps and epoch_done) or last:
            self.evaluate()
        if (t.checkpoint_every_steps and step % t.checkpoint_every_steps == 0) or (
                not t.checkpoint_every_steps and epoch_done) or last or reason:
            self.save_checkpoint(epoch_done)
        return reason

    def _stop_reason(self, last: bool) -> int:
        """Read the vote cast after the previous step, then cast this step's (no waiting)."""
        agreed = self.vote.result()
        if agreed or last:
            return preemption.CARRY_ON if last else agreed
        t = self.cfg.train
        if t.stop_after_steps and self.progress.step >= t.stop_after_steps:
            log.info("stopping after step %d as asked (train.stop_after_steps)",
                     self.progress.step)
            return preemption.STOP_REQUESTED  # every rank knows this without a vote
        self.vote.cast(preemption.reason_of(self.stop_flag, self.deadline))
        return preemption.CARRY_ON

    def _log_step(self, loss: torch.Tensor) -> None:
        """All-reduce the step's loss (a sync point, so only on logging steps) and record it."""
        if self.env.distributed:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG if self.env.backend == "nccl"
                            else dist.ReduceOp.SUM)
            loss = loss if self.env.backend == "nccl" else loss / self.env.world_size
        self.progress.last_loss = loss.item()
        now = time.perf_counter()
        steps = self.progress.step - self._tick_step
        samples = (steps * self.cfg.data.batch_size * self.env.world_size
                   * self.cfg.train.grad_accum_steps)
        if self.metrics:
            self.bar.clear()
            lr = self.scheduler.get_last_lr()[0]
            self.metrics.write(step=self.progress.step, epoch=self.progress.epoch,
                               loss=self.progress.last_loss, lr=lr,
                               samples_per_s=round(samples / max(now - self._tick, 1e-9), 1))
            log.info("step %d/%d epoch %d loss %.4f lr %.3g", self.progress.step,
                     self.total_steps, self.progress.epoch, self.progress.last_loss, lr)
        self._tick, self._tick_step = now, self.progress.step

    # -- evaluation ------------------------------------------------------------------------

    def evaluate(self, record: bool = True) -> dict | None:
        """Loss and accuracy over the eval set (every rank its shard), logged on rank 0."""
        if self.eval_loader is None:
            return None
        result = evaluation.evaluate(self.model, self.eval_loader, self.loss_fn, self.device,
                                     self.cfg.train.precision, self.env.distributed)
        self.last_eval = result
        if self.metrics and record:
            self.bar.clear()
            self.metrics.write(step=self.progress.step, epoch=self.progress.epoch, **result)
            log.info("eval at step %d: loss %.4f accuracy %.4f", self.progress.step,
                     result["eval_loss"], result["eval_accuracy"])
        return result

    # -- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self, epoch_done: bool = False) -> None:
        """Every rank contributes its RNG state; rank 0 writes; every rank learns if it failed."""
        self.bar.clear()
        rng_states = collective.gather_object(rng.capture())  # on rank 0 only
        collective.on_rank_zero(
            lambda: self.store.save(self.progress.step, self._state(rng_states, epoch_done)),
            self.env.rank, "save a checkpoint")

    def _state(self, rng_states: list, epoch_done: bool) -> dict:
        """Everything exact resume needs, as weights_only-loadable data."""
        progress = dataclasses.replace(self.progress)
        if epoch_done:  # the checkpoint resumes at the start of the next epoch
            progress.epoch, progress.batch = progress.epoch + 1, 0
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else {},
            "progress": dataclasses.asdict(progress), "rng": rng_states,
            "world_size": self.env.world_size,
        }

    def _resume(self) -> None:
        """Load the latest complete checkpoint, if any, exactly as it was saved."""
        if not self.cfg.run.resume:
            return
        found = self.store.load_latest(map_location="cpu")
        steps = collective.all_gather_object(found[0] if found else None)
        if len(set(steps)) > 1:
            raise DistributedError(f"ranks see different latest checkpoints {steps}. HINT: "
                                   "run.dir must be on a file system every node shares.")
        if not found:
            return
        step, state = found
        if state["world_size"] != self.env.world_size:
            raise ConfigError(
                f"the checkpoint at step {step} in {self.run_dir} was written by "
                f"{state['world_size']} ranks, this run has {self.env.world_size}; exact resume "
                "needs the same world size. HINT: relaunch with the original number of tasks, "
                "or choose a new run.dir.")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
        rng.restore(state["rng"][self.env.rank])
        log.info("resumed from step %d (epoch %d, batch %d)", step, self.progress.epoch,
                 self.progress.batch)

    # -- the end ---------------------------------------------------------------------------

    def _finish(self) -> dict:
        """Check every rank holds the same weights, then write summary.json (rank 0)."""
        if not hasattr(self, "last_eval") and self.eval_loader is not None:
            self.evaluate(record=False)  # re-run of a finished run: same weights, same metrics
        digest = weights_sha256(self.model)
        digests, hosts = zip(*collective.all_gather_object((digest, self.env.hostname)))
        if len(set(digests)) > 1:
            bad = [r for r, d in enumerate(digests) if d != digests[0]]
            raise DistributedError(f"model weights differ across ranks (ranks {bad} disagree "
                                   "with rank 0): DDP replicas diverged.")
        summary = {
            "world_size": self.env.world_size, "hosts": list(hosts), "steps": self.progress.step,
            "epochs": self.progress.epoch + (self.progress.batch > 0),
            "final_loss": self.progress.last_loss,
            "weights_sha256": digest, "launcher": self.env.launcher, "job_id": self.env.job_id,
            **getattr(self, "last_eval", {}),
        }
        if self.env.is_main:
            atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
            log.info("finished: %d steps, final loss %.4f, weights %s", summary["steps"],
                     summary["final_loss"], digest[:12])
        return summary
