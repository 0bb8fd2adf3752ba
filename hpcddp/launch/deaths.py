"""A rank killed by a signal is a rank death, whatever the ranks left alive say afterwards.

Under NCCL's default error handling (``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``) a collective that
fails or times out ends the process with ``abort()``: SIGABRT, no Python exception, nothing
reported. The survivors then only say they lost a peer, and a later rank's exit status (even
2, bad input) must not decide what happened: the first death does. Torch-free, for the
launcher; a failed step's srun line is read by `hpcddp.resilience.rules`.
"""

import signal

# What usually sends each signal to a training rank, for the one line the user reads.
_CAUSES = {
    signal.SIGABRT: "an NCCL abort (a collective failed or timed out) or a crash in native code",
    signal.SIGKILL: "the kernel's out-of-memory killer, or a hard kill",
    signal.SIGSEGV: "a crash in native code",
    signal.SIGBUS: "a crash in native code (often /dev/shm full)",
}


def signal_of(returncode: int) -> signal.Signals | None:
    """The signal that ended a child (``Popen.returncode`` is then ``-signum``), else None."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode)
    except ValueError:
        return None


def exit_status(sig: signal.Signals) -> int:
    """What a shell and srun report for a process ended by ``sig``: 128 + its number."""
    return 128 + int(sig)


def death_line(rank: int, sig: signal.Signals) -> str:
    """One line naming the rank, the signal, its usual cause and where the stacks are."""
    cause = _CAUSES.get(sig, "a signal")
    return (
        f"local rank {rank} was killed by {sig.name} ({cause}); the others were stopped. "
        f"HINT: its Python stacks at that moment are at the end of RUN_DIR/logs/rank-{rank}.log"
        ", and an NCCL flight recorder dump, if any, is under RUN_DIR/logs/."
    )
