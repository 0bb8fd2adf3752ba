"""Logging for entry points: a rank prefix on every line, one file per rank, console from rank 0.

Library modules only call ``logging.getLogger(__name__)``; handlers are set here, by the
entry points (CLI, `Trainer.fit`), never at import.
"""

import logging
import pathlib
import sys

from hpcddp.launch.distenv import DistEnv

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
        handlers.append(logging.FileHandler(log_dir / f"rank-{env.rank}.log"))
    for handler in handlers:
        handler.setFormatter(_formatter(env))
    logger = logging.getLogger("hpcddp")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    _replace_handlers(logger, handlers)
