"""Python's cyclic garbage collector paused while a rank starts; start-up's heap then frozen.

Importing torch (and the dynamo that DDP imports) makes millions of objects that live as long
as the process. The collector's full passes over them during start-up free next to nothing
and cost a rank about 0.4 CPU-s before its first step (five full passes, measured on the
quickstart), as much as all of hpcddp's own start-up; in training, each full pass walks them
again, a pause inside some step. So a rank pauses the collector before the rank side is
imported and resumes it before its first step: start-up's garbage is collected once and what
is left is frozen (``gc.freeze``), never walked again. Torch-free.
"""

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Collector off from here (a rank, before torch is imported) until `resume`; on again when
    the body ends, for a run that ended before its first step in a process that goes on."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def resume() -> None:
    """Start-up's garbage collected once, the rest set aside for good, the collector on."""
    gc.collect()
    gc.freeze()
    gc.enable()
