"""NCCL's flight recorder, on by default, its dumps in the run's own logs folder.

Under NCCL's default error handling a collective that times out aborts the process: no Python
exception, nothing in the log about which collective or which rank. The flight recorder keeps
the last collectives of every process group in a ring buffer and, on a watchdog timeout,
writes them to a file per rank; comparing those files names the rank that never joined
(`READ_DUMPS`). After a Slurm job's failure the job script's policy reads them to blame the node
that is behind (`hpcddp.records.nccl_blame`) and moves them to that attempt's hang folder.

A timed-out rank does not end at ``dist.timeout_s``: NCCL's watchdog first sleeps four times
``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC`` (15 s by default, so 60 s) for every rank to write its
dump, then aborts. torch reads these variables when a process group is created, so they are
exported with the rest of the environment (`hpcddp.comm.group.export_env`). A variable the
user set wins.
"""

import pathlib
from collections.abc import Mapping

from hpcddp.run_files import FLIGHT_RECORDER_DUMP as DUMP_PREFIX  # torch appends the rank

# How to read the dumps. A rank that died without writing one (killed, or gone before the
# timeout) stops fr_trace with "Missing dump files from ranks" unless it is told to go on.
READ_DUMPS = (
    f"python -m torch.distributed.flight_recorder.fr_trace RUN_DIR/logs -p {DUMP_PREFIX} "
    "--allow-incomplete-ranks"
)
BUFFER_ENTRIES = "2000"  # collectives kept per process group: the last few steps' worth

# each setting under its current name and the names torch still accepts for it
_SETTINGS = (
    (("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), BUFFER_ENTRIES),
    (("TORCH_NCCL_DUMP_ON_TIMEOUT",), "1"),
)
_DUMP_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def flight_recorder_env(
    backend: str, log_dir: pathlib.Path | None, environ: Mapping[str, str]
) -> dict[str, str]:
    """The variables to export for an NCCL group whose run writes logs to ``log_dir``."""
    if backend != "nccl" or log_dir is None:
        return {}
    wanted = [*_SETTINGS, (_DUMP_FILE, str(log_dir.absolute() / DUMP_PREFIX))]
    return {names[0]: value for names, value in wanted if not any(n in environ for n in names)}
