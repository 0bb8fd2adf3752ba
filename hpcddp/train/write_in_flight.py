"""The one checkpoint write in flight on a writer thread: both checkpointers (whole and sharded)
finish it the same way before the next save, a stop or the end of training."""

import concurrent.futures
import logging
from typing import Any

log = logging.getLogger(__name__)

Writing = tuple[int, "concurrent.futures.Future[Any]"]  # (step, the write's future)


def finish(writing: Writing | None) -> None:
    """Wait for ``writing``, if any; raise what the write raised."""
    if writing is None:
        return
    step, future = writing
    if not future.done() and step:
        log.info("waiting for the checkpoint of step %d to be written", step)
    future.result()
