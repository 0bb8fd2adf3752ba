"""One error hierarchy, so callers can catch everything hpcddp raises with one name.

Messages say what was seen, what was expected, and end with a ``HINT:`` that tells the fix.
"""


class HpcddpError(Exception):
    """Base of every error hpcddp raises on purpose."""


class HostlistError(HpcddpError, ValueError):
    """A Slurm hostlist expression that Slurm itself would reject."""


class LaunchError(HpcddpError, ValueError):
    """Launch information (Slurm, torchrun, local) is missing or inconsistent."""


class ConfigError(HpcddpError, ValueError):
    """A configuration file or override that does not describe a valid run."""


class DownloadError(HpcddpError):
    """A guarded download failed (on this rank or on the rank that fetched)."""


class CheckpointError(HpcddpError):
    """A checkpoint could not be written or read."""


class DistributedError(HpcddpError):
    """The process group could not be formed or a peer rank failed."""


class PeerLostError(DistributedError):
    """This rank failed only because another rank died first; that rank's error is the cause."""


class UserCodeError(HpcddpError):
    """The user's own code (a factory, the model's forward) raised; the message names the rank,
    its host and the user's frame, and the trimmed traceback is in that rank's log."""


class NonFiniteError(HpcddpError):
    """Training produced a NaN/inf loss or gradient, and train.nonfinite says stop."""


def agreed(err: HpcddpError) -> HpcddpError:
    """Mark an error that every rank of the job reaches alike: rank 0 alone prints it.

    Without the mark a launch error is printed by each rank that has it, since only that rank
    knows its own place in the job.
    """
    err.agreed = True  # type: ignore[attr-defined]
    return err
