"""What a run tells as it goes: the logged loss, evaluations and rank 0's progress bar.

Figures go to metrics.jsonl through `hpcddp.train.step_reports` (every rank's telemetry is
gathered in the background); the terminal line is drawn from the last logging step, so
drawing it never waits for the device.
"""

import contextlib
import logging
import math
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from hpcddp.comm import hang
from hpcddp.config import Config
from hpcddp.launch.distenv import DistEnv
from hpcddp.progress import ProgressBar, bar
from hpcddp.train import ddp, evaluation
from hpcddp.train.assembly import Parts
from hpcddp.train.state import Progress
from hpcddp.train.timeline import Timeline

log = logging.getLogger(__name__)


class ProgressReport:
    """One rank's reporting: loss lines, evaluations, the progress bar (rank 0 draws it)."""

    def __init__(
        self,
        cfg: Config,
        env: DistEnv,
        device: torch.device,
        parts: Parts,
        timeline: Timeline,
        beat: hang.Beat | None = None,
    ) -> None:
        self.cfg, self.env, self.device, self.parts, self.timeline = (
            cfg,
            env,
            device,
            parts,
            timeline,
        )
        self.beat = beat or hang.Beat()  # tells the hang watchdog a slow phase is under way
        self.bar = ProgressBar(enabled=env.is_main)
        self.last_eval: dict[str, float] | None = None

    def log_step(self, loss: torch.Tensor, progress: Progress, scale: float | None) -> None:
        """All-reduce the step's loss (a sync point, so only on logging steps); report it.

        The metrics line is written once every rank's telemetry has arrived; under fp16 it
        carries the scaler's ``loss_scale``.
        """
        if self.env.distributed:
            nccl = self.env.backend == "nccl"
            dist.all_reduce(loss, op=dist.ReduceOp.AVG if nccl else dist.ReduceOp.SUM)
            loss = loss if nccl else loss / self.env.world_size
        progress.last_loss = loss.item()
        lr = self.parts.scheduler.get_last_lr()[0]
        line = {"step": progress.step, "epoch": progress.epoch,
                "loss": progress.last_loss, "lr": lr}  # fmt: skip
        if scale is not None:
            line["loss_scale"] = scale
        self.parts.reports.send(line, self.parts.clock.close_interval())
        if self.env.is_main:
            self.bar.clear()
            log.info("step %d/%d epoch %d loss %.4f lr %.3g", progress.step,
                     self.parts.total_steps, progress.epoch, progress.last_loss, lr)  # fmt: skip

    def evaluate(self, progress: Progress, record: bool = True) -> dict[str, float] | None:
        """The task's metrics over the eval set (every rank its shard), logged on rank 0."""
        parts = self.parts
        if parts.eval_loader is None:
            return None
        parts.reports.write()  # the step's line before its evaluation's
        with self.outside_steps("evaluation"):
            ddp.sync_buffers(parts.model)
            result = evaluation.evaluate(
                parts.model, parts.eval_loader, parts.task, self.device, self.cfg.train.precision
            )
        self.last_eval = result
        if self.env.is_main and record:
            self.bar.clear()
            parts.reports.record(step=progress.step, epoch=progress.epoch, **result)
            figures = " ".join(f"{k.removeprefix('eval_')} {v:.4f}" for k, v in result.items())
            log.info("eval at step %d: %s", progress.step, figures)
        return result

    def draw_bar(self, progress: Progress) -> None:
        """Rank 0's terminal line: figures from the last logging step (no sync here)."""
        if not self.bar.drawing:
            return
        loss, step, total = progress.last_loss, progress.step, self.parts.total_steps
        figures = self.parts.reports.latest
        line = (
            f"{bar(step, total)} step {step}/{total} "
            f"epoch {progress.epoch} loss {'-' if math.isnan(loss) else f'{loss:.4f}'}"
        )
        if figures:
            eta = (total - step) * figures["step_time_s"]
            line += f" {figures['samples_per_s']:.4g} samples/s ETA {_clock(eta)}"
        self.bar.update(line)

    @contextlib.contextmanager
    def outside_steps(self, phase: str) -> Iterator[None]:
        """Time an evaluation or a save for the timeline, and keep it out of step times."""
        started = time.perf_counter()
        self.beat.phase = phase  # its own, longer hang budget
        try:
            yield
        finally:
            self.beat.phase = hang.STEPS
            spent = time.perf_counter() - started
            self.timeline.add(phase, spent)
            self.parts.clock.exclude(spent)

    def close(self) -> None:
        """The bar's line ended and the metrics file closed, however the run ends."""
        self.bar.close()
        self.parts.reports.close()


def _clock(seconds: float) -> str:
    """``1:02:03`` for an ETA."""
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
