"""The training loop of one rank: resume, accumulation windows, evaluation, checkpoints, stops.

`TrainingRun.execute` reads top to bottom: resume from the latest complete checkpoint, train
in accumulation windows (gradients sync on the last micro-batch only), evaluate and checkpoint
on schedule, stop cleanly when the ranks agree to, and finish with a summary every rank agrees
on. The run is made of parts that each do one job: `hpcddp.train.assembly` builds them,
`hpcddp.train.stopping` decides stops and requeues, `hpcddp.train.guard` holds the NaN policy,
`hpcddp.train.progress_report` tells, `hpcddp.train.ending` finishes. Rank discipline is visible
where it happens: files and prints under ``is_main``; every rank reaches every collective.
"""

import contextlib
import faulthandler
import logging
import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hpcddp.comm import collectives, failures, hang, watchdog
from hpcddp.config import Config
from hpcddp.launch import collector
from hpcddp.launch.distenv import DistEnv
from hpcddp.outcome import RunOutcome, StopReason
from hpcddp.storage import attempts
from hpcddp.storage.rundir import Attempt
from hpcddp.train import batches, data, ddp, ending, flops, preemption, rng, usercode
from hpcddp.train.assembly import assemble
from hpcddp.train.progress_report import ProgressReport
from hpcddp.train.run_notices import RunNotices
from hpcddp.train.state import Progress
from hpcddp.train.stopping import Stopping
from hpcddp.train.timeline import Timeline, since_process_start

log = logging.getLogger(__name__)


class TrainingRun:
    """One process's side of a training run: its parts, built here, and the loop."""

    def __init__(
        self,
        model_fn: Callable[..., torch.nn.Module],
        dataset_fn: Callable[..., Any],
        cfg: Config,
        env: DistEnv,
        device: torch.device,
        run_dir: pathlib.Path,
        stop_flag: preemption.StopFlag,
        notices: RunNotices,
        attempt: Attempt | None = None,
        timeline: Timeline | None = None,
    ) -> None:
        self.cfg, self.env, self.device, self.run_dir = cfg, env, device, run_dir
        self.timeline = timeline or Timeline()
        attempt = attempt or Attempt(job=env.slurm_job, nodes=(env.hostname,))
        # stop_flag: the caller's, for the whole run (a signal during set-up is a clean stop)
        self.parts = assemble(model_fn, dataset_fn, cfg, env, device, run_dir)
        self.stopping = Stopping(cfg, env, stop_flag, self.parts.vote, attempt, run_dir)
        self.beat = hang.Beat()  # the hang watchdog's view of the loop (`hpcddp.comm.watchdog`)
        self.report = ProgressReport(cfg, env, device, self.parts, self.timeline, self.beat)
        self.progress = Progress()
        self.buffers_ready = False  # rank 0's snapshot buffers, allocated after the first step
        self.train_ended = 0.0
        self.notices = notices  # rank 0 posts

    def execute(self) -> RunOutcome:
        """Resume, train to the end (or a clean stop), then summarize."""
        try:
            self._settle_buckets()
            self._resume()
            self.stopping.started = {
                "started": round(time.time() - since_process_start(), 3),
                "loaded": round(time.time(), 3),
            }
            collector.resume()  # start-up is over; the collectives below line the ranks up
            collectives.on_rank_zero(
                lambda: self.parts.reports.open(self.run_dir, self.progress.step),
                self.env.rank,
                "open metrics.jsonl",
            )
            self.stopping.read_deadline()
            self.notices.started(self.progress.step)
            self.parts.clock.restart()  # start-up is no step's time
            with self._watched():
                reason = self._train()
            return self.notices.completed(self._end(reason))
        except Exception as err:
            with (self.run_dir / "logs" / f"rank-{self.env.rank}.log").open("a") as log_file:
                faulthandler.dump_traceback(log_file)  # every thread's stack, for post-mortems
            explained = failures.explain(err, self.env, self.cfg.dist.timeout_s)
            explained = usercode.blame(explained, self.env, "your code in training")
            self.notices.failed(explained, self.progress.step)
            if explained is err:
                raise
            raise explained from err
        finally:
            self.report.close()
            self.notices.close()

    @contextlib.contextmanager
    def _watched(self) -> Iterator[None]:
        """The training steps under the hang watchdog (when dist.hang_timeout_s is set)."""
        self.beat.step = self.progress.step
        attempt, dist_cfg = self.stopping.attempt, self.cfg.dist
        stacks = attempts.hang_dir(self.run_dir, attempt.job, attempt.restart)
        dog = watchdog.watching(
            self.beat, dist_cfg.hang_timeout_s, dist_cfg.hang_slow_phase_s, self.env, stacks,
            attempt.restart,
        )  # fmt: skip
        try:
            yield
        finally:
            if dog is not None:
                dog.stop()

    def _settle_buckets(self) -> None:
        """DDP's bucket layout fixed (and FLOPs counted, the guard's probe found) before step 1.

        Before resume: its forward may read the dataset, which may draw random numbers.
        """
        parts, t = self.parts, self.cfg.train
        first = ddp.first_batch(parts.train_loader.dataset, self.cfg.data.batch_size)
        with (
            self.timeline.phase("buckets"),
            flops.counting(t.count_flops and not t.compile) as counted,
            parts.guard.find_probe(parts.model),
        ):
            on_device = batches.to_device(first, self.device)
            ddp.settle_buckets(parts.ddp, parts.model, on_device, t.precision, parts.task)
        parts.reports.flops_per_sample = counted() / max(batches.size_of(first), 1)

    def _resume(self) -> None:
        """Continue from the latest checkpoint, or start each rank's own random stream.

        With run.resume=false the run directory was found empty, or moved aside, or holds an
        earlier attempt of this same job (`hpcddp.storage.rundir`): what is there is ours.
        """
        resumed = self.parts.checkpoints.resume()
        self.stopping.resumed_step = resumed.step if resumed else 0
        if resumed is None:
            rng.seed_everything(self.cfg.run.seed + self.env.rank)  # own dropout stream
        else:
            self.progress = resumed

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
            if progress.step == self.stopping.resumed_step:
                self.timeline.add("first_step", time.perf_counter() - started)
            left -= window
            progress.batch += window
            progress.step += 1
            self.beat.step = progress.step  # read by the hang watchdog's thread
            if progress.step == self.stopping.resumed_step + 1 and self.env.is_main:
                self.stopping.record_start()
            if parts.guard.judge(seen, progress, self._scale):
                return StopReason.NONFINITE
            if not self.buffers_ready:  # the optimizer has its state now
                parts.checkpoints.prepare()  # host buffers for the first background save
                self.buffers_ready = True
            reason = self._after_step(loss, epoch_done=left == 0)
            if reason:
                return reason
            self.report.draw_bar(progress)
        if left == 0:  # not when max_steps ended the run inside the epoch
            progress.next_epoch()
        return None

    def _after_step(self, loss: torch.Tensor, epoch_done: bool) -> StopReason | None:
        """Log, evaluate and checkpoint on schedule; a stop reason when the run must stop now."""
        parts, t, step = self.parts, self.cfg.train, self.progress.step
        parts.reports.write(wait=False)  # if every rank's figures have arrived
        last = step == parts.total_steps
        reason = self.stopping.reason(step, last)
        if step % t.log_every_steps == 0 or epoch_done or last or reason:
            self.report.log_step(loss, self.progress, self._scale())
        if _due(t.eval_every_steps, step, epoch_done, last):
            self.report.evaluate(self.progress)
            parts.vote.restart(step)
        if _due(t.checkpoint_every_steps, step, epoch_done, last) or reason:
            self.report.bar.clear()
            # CUDA reads the guard a step late: never save a bad step
            if parts.guard.judge(parts.guard.settle(), self.progress, self._scale):
                return StopReason.NONFINITE
            with self.report.outside_steps("checkpoint"):
                parts.checkpoints.save(self.progress, epoch_done)
            parts.vote.restart(step)
        return reason

    def _scale(self) -> float | None:
        """fp16: GradScaler's current loss scale (a sync point: only when logged or judged)."""
        scaler = self.parts.stepper.scaler
        return scaler.get_scale() if scaler is not None else None

    def _end(self, reason: StopReason | None) -> RunOutcome:
        """Drain what is in flight, then finish, conclude a stop, or refuse a non-finite run."""
        parts = self.parts
        self.train_ended = time.perf_counter()
        parts.reports.write()
        parts.vote.result()  # drain the last vote so no collective is left in flight
        with self.timeline.phase("checkpoint"):
            parts.checkpoints.wait()  # a write still in the background is part of the run
        if reason == StopReason.NONFINITE:
            ending.refuse_nonfinite(
                parts, self.env, self.progress, self.cfg.train.nonfinite, self.run_dir
            )
        if reason:
            self.notices.stopped(reason, self.progress.step)  # before a requeue ends this process
            return self.stopping.conclude(reason, self.progress.step)
        evaluated = self.report.last_eval
        if evaluated is None and parts.eval_loader is not None:
            # a re-run of a finished run: same weights, same metrics
            evaluated = self.report.evaluate(self.progress, record=False)
        return ending.finish(
            parts, self.env, self.progress, self.stopping, self.timeline, self.train_ended,
            evaluated,
        )  # fmt: skip


def _due(every: int, step: int, epoch_done: bool, last: bool) -> bool:
    """Every ``every`` steps, or at each epoch's end when ``every`` is 0; always at the end."""
    return bool(every and step % every == 0) or (not every and epoch_done) or last
