"""docs/run-directory.md: one log per rank, every line prefixed with rank and host; the console
has rank 0's progress and only the warnings of the other ranks, and an error the launcher prints
once for the job stays in each rank's own log (`hpcddp.train.logs`)."""

import logging

from hpcddp.launch.distenv import DistEnv
from hpcddp.train.logs import FILE_ONLY, setup_logging, teardown_logging


def test_each_rank_logs_every_line_with_rank_and_host_and_only_rank_0_speaks_info(tmp_path, capfd):
    log = logging.getLogger("hpcddp.train.trainer")
    for rank in (1, 0):
        env = DistEnv(rank, rank, 2, 2, 0, 1, "n1", 29500, "slurm", "7", hostname="n7")
        setup_logging(env, tmp_path)
        try:
            log.info("step 3 of rank %d", rank)
            log.warning("slow loader on rank %d", rank)
            log.error("the job's one error", extra=FILE_ONLY)  # printed once for the job
        finally:
            teardown_logging()
    console = capfd.readouterr().err.splitlines()
    assert [line.split("] ", 1)[1] for line in console] == [
        "WARNING hpcddp.train.trainer: slow loader on rank 1",
        "INFO hpcddp.train.trainer: step 3 of rank 0",
        "WARNING hpcddp.train.trainer: slow loader on rank 0",
    ]
    for rank in (0, 1):
        lines = (tmp_path / f"rank-{rank}.log").read_text().splitlines()
        assert len(lines) == 3 and all(f" [rank {rank}/2 n7] " in line for line in lines)
