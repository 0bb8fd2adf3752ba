"""The loop's seam for side concerns: a side concern is a `Hook`, not lines in the loop.

`hpcddp.train.loop` trains; everything that only watches or tells (notices, the hang watchdog,
the telemetry clock, metrics.jsonl, the log and progress bar, the start-up timeline) attaches
as a `Hook` and overrides the moments it cares about. The loop calls `Hooks`, which calls each
hook in the order they were attached. Every rank attaches the same hooks in the same order and
reaches the same moments, so a hook may take part in a collective where all ranks do.

Lightning's ``Callback`` is the model; the moments are the few this loop has, in run order:

- ``on_start``: resumed, the deadline read, before the first step;
- ``on_step``: after each step the guard let through, once the ranks have decided whether
  to stop, before its evaluation and checkpoint;
- ``on_pause`` / ``on_resume``: around time spent outside the steps (an evaluation, a save);
- ``on_evaluation``: an evaluation's metrics (every rank, the same figures);
- ``on_train_end``: the steps are over without an error, before the run winds down;
- ``on_stop``: an early stop, its checkpoint written, before what follows (a requeue may end
  the process);
- ``on_end``: the run's outcome; ``on_failure``: the error the run ends with;
- ``close``: however the run ends, last.
"""

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from hpcddp.outcome import RunOutcome, StopReason

if TYPE_CHECKING:  # torch-free at run time: the start-up timeline is a hook too
    from hpcddp.train.state import Progress


@dataclasses.dataclass(frozen=True)
class Stepped:
    """One optimizer step done, as a hook sees it: plain numbers, nothing that syncs."""

    progress: "Progress"  # after the step; ``last_loss`` is every rank's mean on logged steps
    seconds: float  # the step's own time on this rank's host
    logged: bool  # a logging step (train.log_every_steps, an epoch's end, the last, a stop)
    stopping: StopReason | None  # the ranks agreed to stop after this step
    lr: float
    loss_scale: float | None = None  # fp16, on logged steps


class Hook:
    """A side concern of the loop: override the moments it needs; the rest do nothing."""

    def on_start(self, progress: "Progress") -> None:
        """Resumed (``progress``) and about to take the first step."""

    def on_step(self, stepped: Stepped) -> None:
        """After a step, before its evaluation and checkpoint."""

    def on_pause(self, phase: str) -> None:
        """Time outside the steps starts: ``phase`` is "evaluation" or "checkpoint"."""

    def on_resume(self, phase: str, seconds: float) -> None:
        """Back to the steps after ``seconds`` in ``phase``."""

    def on_evaluation(self, progress: "Progress", metrics: dict[str, float], record: bool) -> None:
        """The eval set's ``metrics`` at ``progress``; ``record`` False for a re-run's check."""

    def on_train_end(self, progress: "Progress", reason: StopReason | None) -> None:
        """No more steps (``reason``: why they stopped early, None at the end), no error."""

    def on_stop(self, progress: "Progress", reason: StopReason) -> None:
        """A stop's checkpoint is written; what follows (a requeue) may end this process."""

    def on_end(self, outcome: RunOutcome) -> None:
        """The run's outcome, summary written or stop concluded."""

    def on_failure(self, err: BaseException, step: int) -> None:
        """The run fails with ``err`` (already explained) at ``step``."""

    def close(self) -> None:
        """However the run ends, after everything else: let go of threads, files, posts."""


class Hooks(Hook):
    """The hooks attached to one run, each told every moment in the order attached."""

    def __init__(self, hooks: Iterable[Hook] = ()) -> None:
        self.hooks = list(hooks)

    def on_start(self, progress: "Progress") -> None:
        for hook in self.hooks:
            hook.on_start(progress)

    def on_step(self, stepped: Stepped) -> None:
        for hook in self.hooks:
            hook.on_step(stepped)

    def on_pause(self, phase: str) -> None:
        for hook in self.hooks:
            hook.on_pause(phase)

    def on_resume(self, phase: str, seconds: float) -> None:
        for hook in self.hooks:
            hook.on_resume(phase, seconds)

    def on_evaluation(self, progress: "Progress", metrics: dict[str, float], record: bool) -> None:
        for hook in self.hooks:
            hook.on_evaluation(progress, metrics, record)

    def on_train_end(self, progress: "Progress", reason: StopReason | None) -> None:
        for hook in self.hooks:
            hook.on_train_end(progress, reason)

    def on_stop(self, progress: "Progress", reason: StopReason) -> None:
        for hook in self.hooks:
            hook.on_stop(progress, reason)

    def on_end(self, outcome: RunOutcome) -> None:
        for hook in self.hooks:
            hook.on_end(outcome)

    def on_failure(self, err: BaseException, step: int) -> None:
        for hook in self.hooks:
            hook.on_failure(err, step)

    def close(self) -> None:
        """Every hook closed, even after one fails to; the first failure raised after."""
        failed: Exception | None = None
        for hook in self.hooks:
            try:
                hook.close()
            except Exception as err:
                failed = failed or err
        if failed is not None:
            raise failed

    @contextlib.contextmanager
    def outside_steps(self, phase: str) -> Iterator[None]:
        """The body as time outside the steps: paused before, resumed after, however it ends."""
        started = time.perf_counter()
        self.on_pause(phase)
        try:
            yield
        finally:
            self.on_resume(phase, time.perf_counter() - started)
