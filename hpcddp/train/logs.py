"""Logging for entry points: a rank prefix on every line, one file per rank, console from rank 0.

Library modules only call ``logging.getLogger(__name__)``; handlers are set here, by the
entry points (CLI, `Trainer.fit`), never at import. The rank's log file also receives every
thread's Python stack if the process dies of a fatal signal (faulthandler): SIGABRT from NCCL's
watchdog, SIGSEGV, SIGBUS, where no Python handler or exception ever runs.
"""

import faulthandler
import logging
import pathlib
import sys
from typing import TextIO

from hpcddp.launch.distenv import DistEnv
from hpcddp.run_files import rank_log_name

_MARK = "_hpcddp_handler"
# ``log.error(..., extra=FILE_ONLY)``: for this rank's log file, not the console (where the
# same message is printed once for the whole job).
FILE_ONLY = {"hpcddp_file_only": True}


def _console_filter(record: logging.LogRecord) -> bool:
    return not getattr(record, "hpcddp_file_only", False)


def _formatter(env: DistEnv) -> logging.Formatter:
    prefix = f"[rank {env.rank}/{env.world_size} {env.hostname}]"
    return logging.Formatter(
        f"%(asctime)s {prefix} %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )


def _replace_handlers(logger: logging.Logger, handlers: list[logging.Handler]) -> None:
    """Swap in our handlers, leaving any the user installed alone."""
    for handler in [h for h in logger.handlers if getattr(h, _MARK, False)]:
        logger.removeHandler(handler)
        handler.close()
    for handler in handlers:
        setattr(handler, _MARK, True)
        logger.addHandler(handler)


def teardown_logging() -> None:
    """Close the handlers `setup_logging` added (files stay complete, nothing leaks)."""
    _FATAL_STACKS.stop()
    _replace_handlers(logging.getLogger("hpcddp"), [])
    logging.getLogger("hpcddp").propagate = True


def setup_logging(env: DistEnv, log_dir: pathlib.Path | None = None) -> None:
    """Console: INFO on rank 0, warnings elsewhere. File: everything from this rank."""
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.INFO if env.is_main else logging.WARNING)
    console.addFilter(_console_filter)
    handlers: list[logging.Handler] = [console]
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(log_dir / rank_log_name(env.rank))
        _FATAL_STACKS.start(to_file.stream)
        handlers.append(to_file)
    for handler in handlers:
        handler.setFormatter(_formatter(env))
    logger = logging.getLogger("hpcddp")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    _replace_handlers(logger, handlers)


class _FatalStacks:
    """faulthandler aimed at the rank's log file while it is open; as it was before, after."""

    def __init__(self) -> None:
        self.active = False
        self.was_on = False  # on stderr before us (python -X faulthandler): put back

    def start(self, stream: TextIO | None) -> None:
        if stream is None:  # a FileHandler opened with delay=True: nothing to write to yet
            return
        if not self.active:
            self.was_on = faulthandler.is_enabled()
        faulthandler.enable(stream, all_threads=True)
        self.active = True

    def stop(self) -> None:
        if not self.active:
            return
        faulthandler.disable()
        self.active = False
        if self.was_on:
            faulthandler.enable(sys.stderr, all_threads=True)


_FATAL_STACKS = _FatalStacks()  # one per process, as faulthandler itself
