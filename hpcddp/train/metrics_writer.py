"""The run's record on disk: metrics.jsonl and the trackers (rank 0), each logged step's line
carrying every rank's telemetry.

A logged step's line waits for the figures of every rank (`hpcddp.train.telemetry`), which
arrive in the background; `MetricsWriter.write` is asked after each step and writes the line
once they are here, waiting for them only at the next logging step, an evaluation or the end.
It attaches to the loop as a hook (`hpcddp.train.hooks`). What a person watching reads (the
log's lines and the progress bar) is `hpcddp.train.progress_log`.
"""

import logging
import pathlib
from typing import Any

import torch

from hpcddp.comm import collectives
from hpcddp.config import Config
from hpcddp.errors import NonFiniteError
from hpcddp.launch.distenv import DistEnv
from hpcddp.outcome import RunOutcome, StopReason
from hpcddp.records import provenance
from hpcddp.records.metrics_log import MetricsLog
from hpcddp.records.tracking import FAILED, FINISHED, STOPPED, Tracker
from hpcddp.run_files import metrics_path
from hpcddp.train import flops, telemetry
from hpcddp.train.hooks import Hook, Stepped
from hpcddp.train.state import Progress

log = logging.getLogger(__name__)

SLOW_RANK_WARNING = 1.5  # a rank with this many times the median own work is named in the log


class MetricsWriter(Hook):
    """Writes metrics.jsonl and the trackers (rank 0) from every rank's gathered telemetry."""

    def __init__(
        self,
        cfg: Config,
        env: DistEnv,
        device: torch.device,
        hosts: list[str],
        clock: telemetry.IntervalClock | None = None,
        run_dir: pathlib.Path | None = None,
    ) -> None:
        self.cfg, self.env, self.hosts, self.run_dir = cfg, env, hosts, run_dir
        self.clock = clock or telemetry.IntervalClock(device)  # the stepper's, in a run
        # creating its side group is a collective: every rank builds its writer at the same point
        self.figures = telemetry.RankFigures(env.rank, env.world_size, hosts, cfg.dist.timeout_s)
        self.peak_flops = flops.peak_flops(device, cfg.train.precision, cfg.train.peak_tflops)
        self.flops_per_sample = 0.0  # counted on the bucket-settling pass
        self.metrics: MetricsLog | None = None  # rank 0's, once opened
        # how the attempt ended, for the trackers (`on_end` and `on_failure` say finished or
        # failed); anything else, a crash too, may be resumed by a later attempt
        self.ending = STOPPED
        self.pending: dict[str, Any] | None = None  # rank 0's logged step, awaiting its figures
        self.latest: dict[str, Any] = {}  # the last figures written (for the progress bar)

    def open(self, run_dir: pathlib.Path, step: int) -> None:
        """Rank 0's metrics.jsonl and trackers, forgetting what came after ``step``."""
        tracking = self.cfg.tracking
        tracker = None
        if tracking.backends:
            project = tracking.project or self.cfg.run.name
            params = self._params(run_dir)
            tracker = Tracker(tracking.backends, run_dir, step, params, project)
        restarts = self.env.environ.get("SLURM_RESTART_COUNT", "")
        self.metrics = MetricsLog(metrics_path(run_dir), step, tracker, restarts)

    def _params(self, run_dir: pathlib.Path) -> dict[str, Any]:
        """What a tracking run records about itself: config, world, hosts, code."""
        try:
            code = provenance.load(run_dir) or {}
        except ValueError:
            code = {}
        return {
            "config": self.cfg.to_dict(),
            "world_size": self.env.world_size,
            "hosts": sorted(set(self.hosts)),
            "launcher": self.env.launcher,
            "job_id": self.env.job_id,
            "code": [
                {"commit": tree.get("commit"), "dirty": tree.get("dirty")}
                for tree in code.get("trees", [])
            ],
            "versions": code.get("versions", {}),
        }

    # -- the loop's moments (`hpcddp.train.hooks.Hook`) ---------------------------------------

    def on_start(self, progress: Progress) -> None:
        run_dir = self.run_dir
        assert run_dir is not None, "a MetricsWriter attached to a run is given its directory"
        collectives.on_rank_zero(
            lambda: self.open(run_dir, progress.step), self.env.rank, "open metrics.jsonl"
        )

    def on_step(self, stepped: Stepped) -> None:
        """A logged step's line goes out with this rank's interval; otherwise, a line whose
        figures have all arrived is written (a step never waits for them)."""
        if not stepped.logged:
            self.write(wait=False)
            return
        progress = stepped.progress
        line = {"step": progress.step, "epoch": progress.epoch, "loss": progress.last_loss}
        line["lr"] = stepped.lr
        if stepped.loss_scale is not None:
            line["loss_scale"] = stepped.loss_scale
        self.send(line, self.clock.close_interval())

    def on_evaluation(self, progress: Progress, metrics: dict[str, float], record: bool) -> None:
        self.write()  # the step's line before its evaluation's
        if record:
            self.record(step=progress.step, epoch=progress.epoch, **metrics)

    def on_train_end(self, progress: Progress, reason: StopReason | None) -> None:
        self.write()  # the last line: every rank waits for the last gather

    # -- the lines -----------------------------------------------------------------------------

    def send(self, line: dict[str, Any], interval: torch.Tensor) -> None:
        """A logging step: post this rank's ``interval`` figures; hold rank 0's ``line``."""
        self.write()  # the previous interval's, if its gather was slow
        self.figures.start(line["step"], interval)
        if self.metrics is not None:
            self.pending = line

    def write(self, wait: bool = True) -> None:
        """The held line with every rank's figures (rank 0 writes it; every rank must ask).

        Without ``wait`` only once the gather has completed: a step never waits for it.
        """
        figures = self.figures.finish(wait)
        if figures is None and self.figures.pending:
            return  # still in flight
        line, self.pending = self.pending, None
        if figures is None or line is None or self.metrics is None:
            return
        figures.pop("step")
        if self.flops_per_sample:
            samples_per_s = figures["samples_per_s"]
            figures |= flops.utilisation(
                self.flops_per_sample, samples_per_s, self.env.world_size, self.peak_flops
            )
        self.latest = figures
        self.metrics.write(**line, **figures)
        self._warn_if_slow(line["step"], figures)

    def _warn_if_slow(self, step: int, figures: dict[str, Any]) -> None:
        slow = figures["slowest_vs_median"]
        if self.env.world_size > 1 and slow >= SLOW_RANK_WARNING:
            first = step - self.cfg.train.log_every_steps + 1
            rank, host = figures["slowest_rank"], figures["slowest_host"]
            log.warning(
                "rank %d on %s is %.2fx slower than the median rank (steps %d..%d)",
                rank,
                host,
                slow,
                first,
                step,
            )

    def record(self, **record: Any) -> None:
        """Any other line (an evaluation's), on rank 0."""
        if self.metrics is not None:
            self.metrics.write(**record)

    def on_end(self, outcome: RunOutcome) -> None:
        """A run that trained to its end closes its tracking runs as finished."""
        if outcome.finished:
            self.ending = FINISHED

    def on_failure(self, err: BaseException, step: int) -> None:
        """A non-finite stop closes them as failed; any other failure may be resumed."""
        if isinstance(err, NonFiniteError):
            self.ending = FAILED

    def close(self) -> None:
        """Flush and close metrics.jsonl and the trackers (rank 0)."""
        if self.metrics is not None:
            self.metrics.close(self.ending)
