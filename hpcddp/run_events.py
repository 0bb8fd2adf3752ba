"""What happens to a run that people are told about (``notify.events``), each named once.

Rank 0 tells what it sees while it runs (`hpcddp.train.run_notices`); the job script's policy
helper (`hpcddp.slurm.policy`) tells what only the batch shell sees. The value is the word in
``notify.events`` and in the JSON a webhook gets. Torch-free, stdlib only (the ground floor:
the config checks ``notify.events`` against it).
"""

import enum


class Event(str, enum.Enum):
    """One thing that happened to a run; who tells it, in the comment."""

    STARTED = "started"  # rank 0, each attempt, once its checkpoint is loaded
    PREEMPTED = "preempted"  # rank 0: stopped at its time limit or by SIGUSR2, checkpoint saved
    REQUEUED = "requeued"  # the batch shell: a rank died and the job goes back to the queue
    RESTARTED = "restarted"  # the batch shell: a rank died and the job restarts in place
    FAILED = "failed"  # the batch shell (or rank 0 outside hpcddp's job script): given up
    NAN = "nan"  # rank 0: a non-finite loss stopped the run
    HANG = "hang"  # the batch shell: the hang watchdog found the ranks stuck
    COMPLETED = "completed"  # rank 0: trained to the end, summary.json written

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every event's word, in the order above (``notify.events``'s default)."""
        return tuple(event.value for event in cls)
