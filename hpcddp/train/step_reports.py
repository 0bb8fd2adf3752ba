"""What a run reports about itself: rank 0's metrics.jsonl and trackers, and every rank's share
of the per-interval telemetry that goes into them.

A logged step's line waits for the figures of every rank (`hpcddp.train.telemetry`), which
arrive in the background; `Reports.write` is asked after each step and writes the line once
they are here, waiting for them only at the next logging step, an evaluation or the end.
"""

import logging
import pathlib
from typing import Any

import torch

from hpcddp.config import Config
from hpcddp.launch.distenv import DistEnv
from hpcddp.storage import provenance
from hpcddp.storage.metrics_log import MetricsLog
from hpcddp.storage.tracking import Tracker
from hpcddp.train import flops, telemetry

log = logging.getLogger(__name__)

SLOW_RANK_WARNING = 1.5  # a rank with this many times the median own work is named in the log


class Reports:
    """One rank's reporting: the telemetry gather on every rank, the files on rank 0."""

    def __init__(self, cfg: Config, env: DistEnv, device: torch.device, hosts: list[str]) -> None:
        self.cfg, self.env, self.hosts = cfg, env, hosts
        # creating its side group is a collective: every rank builds Reports at the same point
        self.figures = telemetry.RankFigures(env.rank, env.world_size, hosts, cfg.dist.timeout_s)
        self.peak_flops = flops.peak_flops(device, cfg.train.precision, cfg.train.peak_tflops)
        self.flops_per_sample = 0.0  # counted on the bucket-settling pass
        self.metrics: MetricsLog | None = None  # rank 0's, once opened
        # how the attempt ended, for the trackers (`hpcddp.train.ending` says finished or
        # failed); anything else, a crash too, may be resumed by a later attempt
        self.ending = "stopped"
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
        self.metrics = MetricsLog(run_dir / "metrics.jsonl", step, tracker, restarts)

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
            log.warning(
                "rank %d on %s is %.2fx slower than the median rank (steps %d..%d)",
                figures["slowest_rank"], figures["slowest_host"], slow,
                step - self.cfg.train.log_every_steps + 1, step,
            )  # fmt: skip

    def record(self, **record: Any) -> None:
        """Any other line (an evaluation's), on rank 0."""
        if self.metrics is not None:
            self.metrics.write(**record)

    def close(self) -> None:
        """Flush and close metrics.jsonl and the trackers (rank 0)."""
        if self.metrics is not None:
            self.metrics.close(self.ending)
