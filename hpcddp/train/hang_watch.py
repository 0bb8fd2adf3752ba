"""The hang watchdog attached to the loop as a hook: it watches the steps, nothing else.

`hpcddp.comm.watchdog` runs the thread and decides; this hook only tells it where the loop is
(`hpcddp.comm.hang.Beat`: the step, and a slow phase such as a save), starts it with the first
step and stops it once the steps are over, as the run winds down or fails.
"""

import pathlib

from hpcddp.comm import hang, watchdog
from hpcddp.config import DistConfig
from hpcddp.launch.distenv import DistEnv
from hpcddp.outcome import StopReason
from hpcddp.train.hooks import Hook, Stepped
from hpcddp.train.state import Progress


class HangWatch(Hook):
    """Runs the watchdog over the steps when ``dist.hang_timeout_s`` is set."""

    def __init__(
        self, dist_cfg: DistConfig, env: DistEnv, stacks_dir: pathlib.Path, restart: int
    ) -> None:
        self.dist_cfg, self.env, self.stacks_dir, self.restart = dist_cfg, env, stacks_dir, restart
        self.beat = hang.Beat()  # written here, read by the watchdog's thread
        self.dog: watchdog.Watchdog | None = None

    def on_start(self, progress: Progress) -> None:
        self.beat.step = progress.step
        cfg = self.dist_cfg
        self.dog = watchdog.watching(
            self.beat,
            cfg.hang_timeout_s,
            cfg.hang_slow_phase_s,
            self.env,
            self.stacks_dir,
            self.restart,
        )

    def on_step(self, stepped: Stepped) -> None:
        self.beat.step = stepped.progress.step

    def on_pause(self, phase: str) -> None:
        self.beat.phase = phase  # its own, longer budget

    def on_resume(self, phase: str, seconds: float) -> None:
        self.beat.phase = hang.STEPS

    def on_train_end(self, progress: Progress, reason: StopReason | None) -> None:
        self._stop()

    def on_failure(self, err: BaseException, step: int) -> None:
        self._stop()

    def close(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.dog is not None:
            self.dog.stop()
            self.dog = None
