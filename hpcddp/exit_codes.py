"""The exit statuses of ``hpcddp`` commands, in one torch-free place.

The generated batch script (`hpcddp.slurm.jobscript`) and its policy helper
(`hpcddp.slurm.policy`) act on them without importing torch, and the
trainer and CLI return them; both must agree, so both read them from here.
"""

OK = 0
FAILED = 1  # an error hpcddp explained (a message with a HINT)
USAGE = 2  # bad command line or configuration, as argparse uses it
# A rank that failed only because another rank died first (`hpcddp.errors.PeerLostError`): never
# the cause. srun reports the tasks' ends in the order it hears of them, so the survivor's line
# can come before the dead rank's; this status lets the job script's policy pass it over.
# EX_PROTOCOL: the other side of an exchange went away.
PEER_LOST = 76
# A rank the hang watchdog found hung (`hpcddp.comm.watchdog`): a rank death, so the job script
# requeues the job without its node, as for a rank that was killed. timeout(1)'s status.
HUNG = 124
# EX_TEMPFAIL: stopped for the time limit with a checkpoint saved, but the job could not be
# requeued from inside (no scontrol there); run the same command again, or requeue, to resume.
STOPPED_NOT_REQUEUED = 75
INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C, checkpoint saved
TERMINATED = 143  # 128 + SIGTERM: scancel or the end of the job, not requeued
