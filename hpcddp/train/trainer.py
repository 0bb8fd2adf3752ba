"""The shared DDP trainer: user model and dataset in, checkpoints, metrics and a summary out.

`Trainer.fit` joins the process group, prepares the run directory (rank 0), sets up logging,
and hands over to `hpcddp.train.loop.TrainingRun`, which has model, data and optimizer built and
runs the loop; the group and the logging are always torn down afterwards.
"""

import contextlib
import dataclasses
import gc
import logging
import pathlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from hpcddp.comm import collectives as collective
from hpcddp.comm import rendezvous
from hpcddp.comm.group import Joined, joined
from hpcddp.config import Config
from hpcddp.errors import ConfigError, HpcddpError, LaunchError
from hpcddp.launch.distenv import DistEnv
from hpcddp.launch.resolve import check_backend, place
from hpcddp.outcome import RunOutcome
from hpcddp.records import rundir
from hpcddp.run_files import LOGS
from hpcddp.storage.runlock import RunLock
from hpcddp.train import preemption, resharding
from hpcddp.train.assembly import RunSetting
from hpcddp.train.factories import import_factory
from hpcddp.train.hooks import Hook
from hpcddp.train.logs import FILE_ONLY, setup_logging, teardown_logging
from hpcddp.train.loop import assembled
from hpcddp.train.run_notices import RunNotices
from hpcddp.train.timeline import Timeline, since_process_start

log = logging.getLogger(__name__)


class Trainer:
    """Train ``model_fn()`` on ``dataset_fn()`` with DDP as the config says.

    ``model_fn`` and ``dataset_fn`` may be callables or ``"package.module:function"`` paths; the
    config's ``model.kwargs`` and ``data.kwargs`` are passed to them. ``hooks`` are side
    concerns of your own (`hpcddp.train.hooks.Hook`), told each moment of the loop after
    hpcddp's own, on every rank.
    """

    def __init__(
        self,
        model_fn: Callable[..., Any] | str | None = None,
        dataset_fn: Callable[..., Any] | str | None = None,
        config: Config | None = None,
        hooks: Sequence[Hook] = (),
    ) -> None:
        self.config = config or Config()
        self.hooks = list(hooks)
        self.model_fn = _factory(model_fn or self.config.model.factory, "model")
        self.dataset_fn = _factory(dataset_fn or self.config.data.factory, "data")

    def fit(self, env: DistEnv | None = None) -> RunOutcome:
        """Run (or resume) training to the end; how it ended (with summary.json's content, or
        why it stopped early).

        Stop signals (USR2, TERM, Ctrl-C) are caught for the whole call, from set-up to
        teardown, so one arriving at any moment is a clean stop, never a killed rank.
        """
        # A rank's own refusal (no GPU on its node, say) is told to every rank when they meet,
        # so all of them stop at once instead of waiting for this one.
        refusal: HpcddpError | None = None
        timeline = Timeline()
        timeline.add("import", since_process_start())
        if env is None:
            with timeline.phase("env"):
                env, refusal = place()
        if self.config.dist.backend:
            env = dataclasses.replace(env, backend=self.config.dist.backend)
        try:
            if self.config.dist.backend:  # HPCDDP_BACKEND was checked where it was read
                check_backend(env.backend, env.device, "dist.backend")
        except LaunchError as err:
            refusal = refusal or err
        stop_flag = preemption.StopFlag()
        in_main_thread = threading.current_thread() is threading.main_thread()
        if in_main_thread:  # Python lets only the main thread handle signals
            stop_flag.install()
        try:
            return self._fit(env, stop_flag, refusal, timeline)
        finally:
            if in_main_thread:
                stop_flag.uninstall()

    def _fit(
        self,
        env: DistEnv,
        stop_flag: preemption.StopFlag,
        refusal: HpcddpError | None,
        timeline: Timeline,
    ) -> RunOutcome:
        dist_cfg = self.config.dist
        lock = RunLock(pathlib.Path(self.config.run.dir), env.job_id)  # rank 0, in prepare
        meeting = time.perf_counter()
        with (
            joined(
                env,
                dist_cfg.timeout_s,
                socket_ifname=dist_cfg.socket_ifname,
                refusal=refusal,
                pin_cpus=dist_cfg.pin_cpus,
                log_dir=pathlib.Path(self.config.run.dir) / LOGS,  # NCCL's flight recorder
            ) as done,
            _released(lock),
        ):
            timeline.add("rendezvous", time.perf_counter() - meeting)
            setup = time.perf_counter()
            attempt = _attempt(env, done)
            run_dir = collective.on_rank_zero(
                lambda: rundir.prepare(self.config, attempt, lock=lock),
                env.rank,
                "prepare the run directory",
            )
            setup_logging(env, run_dir / LOGS)
            _log_place(env, done)
            try:
                timeline.add("setup", time.perf_counter() - setup)
                return self._run(env, done.device, run_dir, stop_flag, attempt, timeline)
            except HpcddpError as err:  # printed once, by rank 0 or the launcher; kept by all
                log.error("%s", err, extra=FILE_ONLY)
                raise
            finally:
                teardown_logging()
                gc.collect()  # the run is gone: DDP must not outlive its process group

    def _run(
        self,
        env: DistEnv,
        device: torch.device,
        run_dir: pathlib.Path,
        stop_flag: preemption.StopFlag,
        attempt: rundir.Attempt,
        timeline: Timeline,
    ) -> RunOutcome:
        """Build and execute the run here, so nothing holds it once this returns."""
        notices = RunNotices(self.config, env)  # a run that fails while being built is told too
        try:
            with timeline.phase("setup"):  # the model, data, optimizer and DDP: user code runs
                # a checkpoint of another world size: the accumulation that keeps its batch
                config = resharding.keep_global_batch(self.config, env, run_dir)
                collective.on_rank_zero(
                    lambda: rundir.record_code(config, run_dir, attempt),
                    env.rank,
                    "record the code that runs",
                )
                setting = RunSetting(config, env, device, run_dir, attempt, timeline)
                side = [notices, *self.hooks]
                run = assembled(self.model_fn, self.dataset_fn, setting, stop_flag, side)
        except Exception as err:
            notices.on_failure(err, 0)
            notices.close()
            raise
        return run.execute()


@contextlib.contextmanager
def _released(lock: RunLock) -> Iterator[None]:
    """Hold the run directory for the whole run, and let it go however the run ends."""
    try:
        yield
    finally:
        lock.release()


def _attempt(env: DistEnv, done: Joined) -> rundir.Attempt:
    """This attempt of the job, for the run directory's record (hosts known on rank 0)."""
    hosts = [host for host, _ in done.meeting.everyone.values()] if done.meeting else []
    return rundir.Attempt(
        job=env.slurm_job,  # what a requeue keeps; local runs have none
        restart=env.restart_count,
        nodes=tuple(dict.fromkeys(hosts or [env.hostname])),
        gpus=env.world_size if done.device.type == "cuda" else 0,
        allocated_nodes=int(env.environ.get("SLURM_JOB_NUM_NODES") or 0),
    )


def _log_place(env: DistEnv, done: Joined) -> None:
    """Each rank's place in its own log; the network every rank chose, once, on rank 0."""
    network = done.meeting.network if done.meeting else None
    log.info(
        "local rank %d, node %d/%d, device %s, backend %s, master %s:%d, network %s, "
        "launcher %s, job %s",
        env.local_rank,
        env.node_rank,
        env.num_nodes,
        done.device,  # the rendezvous may have given this rank another GPU than it guessed
        env.backend,
        env.master_addr,
        env.master_port,
        f"{network.interface} {network.address} ({network.chosen_by})" if network else "-",
        env.launcher,
        env.job_id or "-",
    )
    if done.meeting and env.is_main:
        log.info("network: %s", rendezvous.as_text(done.meeting.everyone))


def _factory(spec: Callable[..., Any] | str, what: str) -> Callable[..., Any]:
    if callable(spec):
        return spec
    if not spec:
        raise ConfigError(
            f"no {what} factory given. HINT: set {what}.factory: "
            "'package.module:function' in the config."
        )
    return import_factory(spec, what)
