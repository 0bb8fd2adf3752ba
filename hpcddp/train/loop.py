"""The training loop of one rank: resume, accumulation windows, evaluation, checkpoints, stops.

`TrainingRun.execute` reads top to bottom: resume from the latest complete checkpoint, train
in accumulation windows (gradients sync on the last micro-batch only), evaluate and checkpoint
on schedule, stop cleanly when the ranks agree to, and finish with a summary every rank agrees
on. Rank discipline is visible where it happens: files and prints under ``is_main``; every rank
reaches every collective.
"""

import contextlib
import faulthandler
import json
import logging
import math
import os
import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from hpcddp.comm import collectives, failures, hang, watchdog
from hpcddp.config import Config
from hpcddp.errors import ConfigError, DistributedError, NonFiniteError
from hpcddp.launch import deadline, requeue
from hpcddp.launch.distenv import DistEnv
from hpcddp.progress import ProgressBar, bar
from hpcddp.storage import attempts
from hpcddp.storage.atomic import atomic_write_text
from hpcddp.storage.rundir import Attempt
from hpcddp.train import (
    batches,
    building,
    data,
    ddp,
    evaluation,
    flops,
    guard,
    preemption,
    rng,
    telemetry,
    usercode,
)
from hpcddp.train.checkpointing import Checkpointer, Trained
from hpcddp.train.optim import make_optimizer, make_scheduler
from hpcddp.train.state import Progress, weights_sha256
from hpcddp.train.step_reports import Reports
from hpcddp.train.stepping import Stepper
from hpcddp.train.task import Task
from hpcddp.train.timeline import Timeline, since_process_start, summarise, table

log = logging.getLogger(__name__)


class TrainingRun:
    """One process's side of a training run: the model, data and optimizer, and the loop."""

    def __init__(
        self,
        model_fn: Callable[..., torch.nn.Module],
        dataset_fn: Callable[..., Any],
        cfg: Config,
        env: DistEnv,
        device: torch.device,
        run_dir: pathlib.Path,
        stop_flag: preemption.StopFlag,
        attempt: Attempt | None = None,
        timeline: Timeline | None = None,
    ) -> None:
        self.cfg, self.env, self.device, self.run_dir = cfg, env, device, run_dir
        self.timeline = timeline or Timeline()
        self.attempt = attempt or Attempt(job=env.job_id, nodes=(env.hostname,))
        # installed by the caller for the whole run: a signal during set-up is a clean stop
        self.stop_flag = stop_flag
        # every rank builds its own, then all agree before DDP: a fault on one ends them all
        built = building.build(model_fn, dataset_fn, cfg, env, device)
        model = built.model
        self.train_loader, self.eval_loader = built.train_loader, built.eval_loader
        self.steps_per_epoch = math.ceil(len(self.train_loader) / cfg.train.grad_accum_steps)
        if self.steps_per_epoch == 0:  # every rank gets the same number of samples
            per_rank = data.samples_per_rank(self.train_loader)
            raise ConfigError(
                f"the training set gives each rank {per_rank} samples, not one batch "
                f"(data.batch_size={cfg.data.batch_size}, data.drop_last=true, world size "
                f"{env.world_size}). HINT: lower data.batch_size or set data.drop_last=false."
            )
        self.total_steps = cfg.train.max_steps or cfg.train.epochs * self.steps_per_epoch
        self.model, self.ddp = ddp.wrap(model, cfg, env, device)
        self.task = Task.resolve(cfg.task, self.model)
        self.optimizer = make_optimizer(self.model.parameters(), cfg.optim)
        self.scheduler = make_scheduler(self.optimizer, cfg.optim, self.total_steps)
        self.scaler = ddp.make_scaler(cfg.train.precision)
        self.guard = guard.Guard(cfg.train, device, scaled=self.scaler is not None)
        self.clock = telemetry.IntervalClock(device)
        self.stepper = Stepper(
            cfg, device, self.ddp, self.model, self.optimizer, self.scheduler, self.scaler,
            self.task, self.guard, self.clock,
        )  # fmt: skip
        self.checkpoints = Checkpointer(
            run_dir,
            cfg.train,
            cfg.dist.timeout_s,
            env,
            Trained(self.model, self.optimizer, self.scheduler, self.scaler),
        )
        # side groups are made by collectives: every rank makes them here, in the same order
        timeout_s = cfg.dist.timeout_s
        self.vote = preemption.StopVote(env.backend, env.distributed, timeout_s=timeout_s)
        self.hosts = built.hosts  # gathered at the agreement point: no collective of its own
        self.reports = Reports(cfg, env, device, self.hosts)  # telemetry's side group
        self.train_ended = 0.0
        self.progress = Progress()
        self.nonfinite_local = False  # whether this rank's own loss was the non-finite one
        self.buffers_ready = False  # rank 0's snapshot buffers, allocated after the first step
        self.deadline: float | None = None  # when to stop ahead of the job's time limit
        self.resumed_step = 0  # where this attempt started
        self.last_eval: dict[str, float] | None = None
        self.bar = ProgressBar(enabled=env.is_main)
        self.beat = hang.Beat()  # the hang watchdog's view of the loop (`hpcddp.comm.watchdog`)
        self.started: dict[str, float] = {}  # this attempt's start times, for recovery

    # -- the loop ---------------------------------------------------------------------------

    def execute(self) -> dict[str, Any]:
        """Resume, train to the end (or a clean stop), then summarize."""
        try:
            # before resume: its forward may read the dataset, which may draw random numbers
            first = ddp.first_batch(self.train_loader.dataset, self.cfg.data.batch_size)
            count = self.cfg.train.count_flops and not self.cfg.train.compile
            with (
                self.timeline.phase("buckets"),
                flops.counting(count) as counted,
                self.guard.find_probe(self.model),
            ):
                ddp.settle_buckets(
                    self.ddp,
                    self.model,
                    batches.to_device(first, self.device),
                    self.cfg.train.precision,
                    self.task,
                )
            self.reports.flops_per_sample = counted() / max(batches.size_of(first), 1)
            self._resume()
            self.started = {"started": round(time.time() - since_process_start(), 3),
                            "loaded": round(time.time(), 3)}  # fmt: skip
            collectives.on_rank_zero(
                lambda: self.reports.open(self.run_dir, self.progress.step),
                self.env.rank,
                "open metrics.jsonl",
            )
            self.deadline = self._deadline()
            self.beat.step = self.progress.step
            dog = watchdog.watching(
                self.beat, self.cfg.dist.hang_timeout_s, self.cfg.dist.hang_slow_phase_s,
                self.env, attempts.hang_dir(self.run_dir, self.attempt.job, self.attempt.restart),
                self.attempt.restart,
            )  # fmt: skip
            try:
                reason = self._train()
            finally:
                if dog is not None:
                    dog.stop()
            self.train_ended = time.perf_counter()
            self.reports.write()
            self.vote.result()  # drain the last vote so no collective is left in flight
            with self.timeline.phase("checkpoint"):
                self.checkpoints.wait()  # a write still in the background is part of the run
            if reason == preemption.STOP_NONFINITE:
                self._refuse_nonfinite()
            return self._stopped(reason) if reason else self._finish()
        except Exception as err:
            with (self.run_dir / "logs" / f"rank-{self.env.rank}.log").open("a") as log_file:
                faulthandler.dump_traceback(log_file)  # every thread's stack, for post-mortems
            explained = failures.explain(err, self.env, self.cfg.dist.timeout_s)
            explained = usercode.blame(explained, self.env, "your code in training")
            if explained is err:
                raise
            raise explained from err
        finally:
            self.bar.close()
            self.reports.close()

    def _resume(self) -> None:
        """Continue from the latest checkpoint, or start each rank's own random stream.

        With run.resume=false the run directory was found empty, or moved aside, or holds an
        earlier attempt of this same job (`hpcddp.storage.rundir`): what is there is ours.
        """
        resumed = self.checkpoints.resume()
        self.resumed_step = resumed.step if resumed else 0
        if resumed is None:
            rng.seed_everything(self.cfg.run.seed + self.env.rank)  # own dropout stream
        else:
            self.progress = resumed

    def _deadline(self) -> float | None:
        """When to stop on our own, ahead of the job's time limit (rank 0 asks Slurm).

        A job whose time cannot hold the stop margin is refused: it would requeue forever.
        """
        margin = self.cfg.train.stop_before_end_s
        end = collectives.on_rank_zero(
            lambda: self._job_end(margin), self.env.rank, "read the job's end time"
        )
        return None if end is None else end - margin

    def _job_end(self, margin: float) -> float | None:
        end = deadline.job_end_time(os.environ)
        deadline.check_time_fits(end, margin, time.time())
        return end

    def _stopped(self, reason: int) -> dict[str, Any]:
        """After the stop checkpoint: requeue a preempted Slurm job (rank 0) and report."""
        outcome: dict[str, Any] = {
            "stopped": True,
            "step": self.progress.step,
            "reason": preemption.REASON_NAMES[reason],
        }
        if reason == preemption.STOP_PREEMPTED:
            self._refuse_endless_requeue()
        if self.env.is_main:  # before requeueing, which ends the job's processes
            self._record_attempt(outcome["reason"])
        if reason == preemption.STOP_PREEMPTED:
            requeued, message = collectives.on_rank_zero(
                requeue.requeue, self.env.rank, "requeue the job"
            )
            outcome["requeued"] = requeued
            (log.info if requeued else log.error)(
                "preempted at step %d, checkpoint saved; %s", self.progress.step, message
            )
        return outcome

    def _record_attempt(self, cause: str) -> None:
        """Rank 0: this attempt's line in attempts.jsonl (`hpcddp.storage.attempts`)."""
        a = self.attempt
        attempts.record(
            self.run_dir,
            job=a.job,
            restart=a.restart,
            nodes=list(a.nodes),
            cause=cause,
            step=self.progress.step,
            from_step=self.resumed_step,
            times=self.started,
        )

    def _record_start(self) -> None:
        """Rank 0, after the attempt's first step: its start times (`hpcddp.storage.attempts`),
        to starts.jsonl when it recovers from a failure, so `hpcddp status` shows it at once."""
        self.started["first_step"] = round(time.time(), 3)
        if attempts.last_recovery(self.run_dir) is None:  # nothing failed: nothing to recover
            return
        try:
            attempts.record_start(
                self.run_dir, job=self.attempt.job, restart=self.attempt.restart, times=self.started
            )
        except OSError as err:  # a timing record is not worth the run
            log.warning("could not record this attempt's start times: %s", err)

    def _refuse_endless_requeue(self) -> None:
        """The stop time passed within the attempt's first step: a requeue would gain one step."""
        passed = self.deadline is not None and time.time() >= self.deadline
        if passed and self.progress.step - self.resumed_step <= 1:
            raise ConfigError(deadline.no_room_message(self.cfg.train.stop_before_end_s))

    def _train(self) -> int:
        """Epochs of accumulation windows; a stop reason if stopped early (checkpoint saved)."""
        t = self.cfg.train
        # max_steps, when set, decides alone: epochs then only count passes over the data
        while self.progress.step < self.total_steps and (
            t.max_steps or self.progress.epoch < t.epochs
        ):
            data.start_epoch(
                self.train_loader,
                self.progress.epoch,
                self.cfg.run.seed,
                skip_batches=self.progress.batch,
            )
            loader, left = iter(self.train_loader), len(self.train_loader)
            while left > 0 and self.progress.step < self.total_steps:
                window = min(t.grad_accum_steps, left)
                started = time.perf_counter()
                logging_next = (self.progress.step + 1) % t.log_every_steps == 0
                loss, nonfinite = self.stepper.step(loader, window, logging_next)
                if self.progress.step == self.resumed_step:
                    self.timeline.add("first_step", time.perf_counter() - started)
                left -= window
                self.progress.batch += window
                self.progress.step += 1
                self.beat.step = self.progress.step  # read by the hang watchdog's thread
                if self.progress.step == self.resumed_step + 1 and self.env.is_main:
                    self._record_start()
                if self._stop_for_nonfinite(nonfinite, loss):
                    return preemption.STOP_NONFINITE
                if not self.buffers_ready:  # the optimizer has its state now
                    self.checkpoints.prepare()  # host buffers for the first background save
                    self.buffers_ready = True
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
        """Rank 0's terminal line: figures from the last logging step (no sync here)."""
        loss, step, figures = self.progress.last_loss, self.progress.step, self.reports.latest
        line = (
            f"{bar(step, self.total_steps)} step {step}/{self.total_steps} "
            f"epoch {self.progress.epoch} loss {'-' if math.isnan(loss) else f'{loss:.4f}'}"
        )
        if figures:
            eta = (self.total_steps - step) * figures["step_time_s"]
            line += f" {figures['samples_per_s']:.4g} samples/s ETA {_clock(eta)}"
        self.bar.update(line)

    def _stop_for_nonfinite(self, nonfinite: bool, loss: torch.Tensor) -> bool:
        """Count a non-finite step; True when the policy says the run ends here.

        Every rank reaches the same answer at the same step (see `hpcddp.train.guard`); the
        first rank whose own loss was not finite is named once the run has stopped.
        """
        if not nonfinite:
            return False
        self.progress.skipped_steps += 1
        self.nonfinite_local = not bool(torch.isfinite(loss))
        policy, skipped = self.cfg.train.nonfinite, self.progress.skipped_steps
        if policy == "skip" and skipped <= self.cfg.train.nonfinite_max_skips:
            log.warning("step %d: non-finite loss or gradients, step skipped (%d so far)",
                        self.progress.step, skipped)  # fmt: skip
            return False
        return True

    def _refuse_nonfinite(self) -> None:
        """After a non-finite stop: summary.json says why (rank 0), then every rank raises."""
        seen = collectives.all_gather_object(self.nonfinite_local)
        ranks = [r for r, bad in enumerate(seen) if bad]
        latest = self.checkpoints.store.latest_step()
        text = guard.message(
            self.progress.step, ranks, self.progress.skipped_steps, latest,
            self.cfg.train.nonfinite,
        )  # fmt: skip
        if self.env.is_main:
            record = {"stopped": True, "status": "failed", "reason": "nonfinite",
                      "step": self.progress.step, "first_rank": ranks[0] if ranks else None,
                      "skipped_steps": self.progress.skipped_steps, "latest_checkpoint": latest,
                      "world_size": self.env.world_size, "message": text}  # fmt: skip
            atomic_write_text(self.run_dir / "summary.json", json.dumps(record, indent=2) + "\n")
        raise NonFiniteError(text)

    def _after_step(self, loss: torch.Tensor, epoch_done: bool) -> int:
        """Log, evaluate and checkpoint on schedule; a stop reason when the run must stop now."""
        self.reports.write(wait=False)  # if every rank's figures have arrived
        t, step = self.cfg.train, self.progress.step
        last = step == self.total_steps
        reason = self._stop_reason(step, last)
        if step % t.log_every_steps == 0 or epoch_done or last or reason:
            self._log_step(loss)
        if (
            (t.eval_every_steps and step % t.eval_every_steps == 0)
            or (not t.eval_every_steps and epoch_done)
            or last
        ):
            self.evaluate()
            self.vote.restart(step)
        if (
            (t.checkpoint_every_steps and step % t.checkpoint_every_steps == 0)
            or (not t.checkpoint_every_steps and epoch_done)
            or last
            or reason
        ):
            self.bar.clear()
            if self.guard.settle():  # CUDA reads the guard a step late: never save a bad step
                self.progress.skipped_steps += 1
                self.nonfinite_local = False
                return preemption.STOP_NONFINITE
            with self._outside_steps("checkpoint"):
                self.checkpoints.save(self.progress, epoch_done)
            self.vote.restart(step)
        return reason

    def _stop_reason(self, step: int, last: bool) -> int:
        """Read the vote cast after the previous step, then cast one if due (no waiting)."""
        agreed = self.vote.result()
        if agreed or last:
            return preemption.CARRY_ON if last else agreed
        t = self.cfg.train
        if t.stop_after_steps and step >= t.stop_after_steps:
            log.info("stopping after step %d as asked (train.stop_after_steps)", step)
            return preemption.STOP_REQUESTED  # every rank knows this without a vote
        if self.vote.due(step):
            self.vote.cast(preemption.reason_of(self.stop_flag, self.deadline), step)
        return preemption.CARRY_ON

    def _log_step(self, loss: torch.Tensor) -> None:
        """All-reduce the step's loss (a sync point, so only on logging steps); report it.

        Every rank's telemetry for the interval is gathered in the background; the metrics
        line is written once it has arrived (`hpcddp.train.step_reports`).
        """
        if self.env.distributed:
            nccl = self.env.backend == "nccl"
            dist.all_reduce(loss, op=dist.ReduceOp.AVG if nccl else dist.ReduceOp.SUM)
            loss = loss if nccl else loss / self.env.world_size
        self.progress.last_loss = loss.item()
        lr = self.scheduler.get_last_lr()[0]
        line = {"step": self.progress.step, "epoch": self.progress.epoch,
                "loss": self.progress.last_loss, "lr": lr}  # fmt: skip
        self.reports.send(line, self.clock.close_interval())
        if self.env.is_main:
            self.bar.clear()
            log.info(
                "step %d/%d epoch %d loss %.4f lr %.3g",
                self.progress.step,
                self.total_steps,
                self.progress.epoch,
                self.progress.last_loss,
                lr,
            )

    @contextlib.contextmanager
    def _outside_steps(self, phase: str) -> Iterator[None]:
        """Time an evaluation or a save for the timeline, and keep it out of step times."""
        started = time.perf_counter()
        self.beat.phase = phase  # its own, longer hang budget
        try:
            yield
        finally:
            self.beat.phase = hang.STEPS
            spent = time.perf_counter() - started
            self.timeline.add(phase, spent)
            self.clock.exclude(spent)

    # -- evaluation ------------------------------------------------------------------------

    def evaluate(self, record: bool = True) -> dict[str, float] | None:
        """The task's metrics over the eval set (every rank its shard), logged on rank 0."""
        if self.eval_loader is None:
            return None
        self.reports.write()  # the step's line before its evaluation's
        with self._outside_steps("evaluation"):
            ddp.sync_buffers(self.model)
            result = evaluation.evaluate(
                self.model, self.eval_loader, self.task, self.device, self.cfg.train.precision
            )
        self.last_eval = result
        if self.env.is_main and record:
            self.bar.clear()
            self.reports.record(step=self.progress.step, epoch=self.progress.epoch, **result)
            figures = " ".join(f"{k.removeprefix('eval_')} {v:.4f}" for k, v in result.items())
            log.info("eval at step %d: %s", self.progress.step, figures)
        return result

    # -- the end ---------------------------------------------------------------------------

    def _finish(self) -> dict[str, Any]:
        """Check every rank holds the same weights, then write summary.json (rank 0)."""
        if self.last_eval is None and self.eval_loader is not None:
            self.evaluate(record=False)  # re-run of a finished run: same weights, same metrics
        ddp.sync_buffers(self.model)
        digest = weights_sha256(self.model)
        self.timeline.add("teardown", time.perf_counter() - self.train_ended)
        gathered = collectives.all_gather_object((digest, self.env.hostname, self.timeline.seconds))
        digests, hosts = [d for d, _, _ in gathered], [h for _, h, _ in gathered]
        if len(set(digests)) > 1:
            bad = [r for r, d in enumerate(digests) if d != digests[0]]
            raise DistributedError(
                f"model weights differ across ranks (ranks {bad} disagree "
                "with rank 0): DDP replicas diverged."
            )
        timeline = summarise([seconds for _, _, seconds in gathered], hosts)
        summary = {
            "world_size": self.env.world_size,
            "hosts": list(hosts),
            "steps": self.progress.step,
            "epochs": self.progress.epoch + (self.progress.batch > 0),
            "final_loss": self.progress.last_loss,
            "weights_sha256": digest,
            "skipped_steps": self.progress.skipped_steps,
            "launcher": self.env.launcher,
            "job_id": self.env.job_id,
            **(self.last_eval or {}),
            "timeline": timeline,
        }
        # a re-run of a finished run trains nothing and changes nothing (its timeline included)
        rerun = self.progress.step == self.resumed_step and (self.run_dir / "summary.json").exists()
        if self.env.is_main and not rerun:
            self._record_attempt("finished")
            summary["attempts"] = attempts.history(self.run_dir)
            atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        if self.env.is_main:
            log.info(
                "finished: %d steps, final loss %.4f, weights %s",
                summary["steps"],
                summary["final_loss"],
                digest[:12],
            )
            log.info("where the time went (seconds per rank):\n%s", table(timeline))
        return summary


def _clock(seconds: float) -> str:
    """``1:02:03`` for an ETA."""
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
