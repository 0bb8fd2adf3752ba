"""What a person watching the run reads: the log's loss and eval lines, rank 0's progress bar.

A loop hook (`hpcddp.train.hooks`). The files a run leaves (metrics.jsonl, the trackers) are
`hpcddp.train.metrics_writer`; the bar is drawn from the figures last written there, so drawing
it never waits for the device or the other ranks.
"""

import logging
import math

from hpcddp.launch.distenv import DistEnv
from hpcddp.progress import ProgressBar, bar
from hpcddp.train.hooks import Hook, Stepped
from hpcddp.train.metrics_writer import MetricsWriter
from hpcddp.train.state import Progress

log = logging.getLogger(__name__)


class ProgressLog(Hook):
    """Rank 0's log lines for logged steps and evaluations, and the terminal's progress bar."""

    def __init__(self, env: DistEnv, written: MetricsWriter, total_steps: int) -> None:
        self.written = written  # its latest figures: samples/s and the ETA on the bar
        self.total_steps = total_steps
        self.bar = ProgressBar(enabled=env.is_main)
        self.speaks = env.is_main
        self.shown: Progress | None = None  # what the bar shows, to redraw after a pause

    def on_step(self, stepped: Stepped) -> None:
        progress = stepped.progress
        if stepped.logged and self.speaks:
            self.bar.clear()
            log.info(
                "step %d/%d epoch %d loss %.4f lr %.3g",
                progress.step,
                self.total_steps,
                progress.epoch,
                progress.last_loss,
                stepped.lr,
            )
        self.shown = progress if stepped.stopping is None else None
        if self.shown is not None:
            self.draw_bar(self.shown)

    def on_pause(self, phase: str) -> None:
        self.bar.clear()  # a log line may come: an evaluation's, a save's

    def on_resume(self, phase: str, seconds: float) -> None:
        if self.shown is not None:
            self.draw_bar(self.shown)

    def on_evaluation(self, progress: Progress, metrics: dict[str, float], record: bool) -> None:
        if self.speaks and record:
            self.bar.clear()
            figures = " ".join(f"{k.removeprefix('eval_')} {v:.4f}" for k, v in metrics.items())
            log.info("eval at step %d: %s", progress.step, figures)

    def draw_bar(self, progress: Progress) -> None:
        """Rank 0's terminal line: figures from the last logging step (no sync here)."""
        if not self.bar.drawing:
            return
        loss, step, total = progress.last_loss, progress.step, self.total_steps
        figures = self.written.latest
        line = (
            f"{bar(step, total)} step {step}/{total} "
            f"epoch {progress.epoch} loss {'-' if math.isnan(loss) else f'{loss:.4f}'}"
        )
        if figures:
            eta = (total - step) * figures["step_time_s"]
            line += f" {figures['samples_per_s']:.4g} samples/s ETA {_clock(eta)}"
        self.bar.update(line)

    def close(self) -> None:
        """The bar's line ended, however the run ends."""
        self.bar.close()


def _clock(seconds: float) -> str:
    """``1:02:03`` for an ETA."""
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
