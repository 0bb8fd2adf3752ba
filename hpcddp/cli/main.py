"""The ``hpcddp`` command: small subcommands, each a thin shell over the library.

Errors hpcddp raises on purpose end the command with one line and a non-zero exit (2 for bad
input, 1 for failures at run time); anything else keeps its traceback. An error every rank
reaches is printed once: by our local launcher, or by rank 0 (`hpcddp.launch.error_reports`).
"""

import argparse
import atexit
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence

from hpcddp import exit_codes
from hpcddp.cli import check, checkpoint, jobs, plot, sbatch, sweep, train
from hpcddp.cli import report as report_command
from hpcddp.errors import (
    ConfigError,
    HostlistError,
    HpcddpError,
    LaunchError,
    PeerLostError,
    UserCodeError,
)
from hpcddp.launch import error_reports
from hpcddp.launch.contexts import claimed_rank

USAGE_ERRORS = (ConfigError, LaunchError, HostlistError)
AFTER_RANK_ZERO_S = 1.0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(prog="hpcddp", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train.add_parsers(sub)  # train, env
    sbatch.add_parser(sub)
    jobs.add_parsers(sub)  # submit, status, logs
    sweep.add_parser(sub)
    plot.add_parser(sub)
    check.add_parser(sub)
    checkpoint.add_parser(sub)  # inspect, export
    report_command.add_parser(sub)
    return parser


def exit_status(err: HpcddpError) -> int:
    """Bad input is 2 wherever it is found; a rank that only lost a peer 76 (never the cause);
    other errors hpcddp explains are 1."""
    if isinstance(err, USAGE_ERRORS):
        return exit_codes.USAGE
    return exit_codes.PEER_LOST if isinstance(err, PeerLostError) else exit_codes.FAILED


def report(err: HpcddpError, code: int) -> None:
    """Say what ended this process, once per job rather than once per rank."""
    path = os.environ.get(error_reports.REPORT_FILE_VAR)
    if path:
        rank = claimed_rank(os.environ) or 0
        found = error_reports.Report(
            rank, socket.gethostname(), code, str(err), isinstance(err, PeerLostError)
        )
        error_reports.write(path, found)
        return
    agreed = getattr(err, "agreed", False)
    if agreed:
        # Under `srun --kill-on-bad-exit` the first rank to exit ends the others: ended now,
        # this rank still leaves with the job's status, not as "Terminated".
        error_reports.leave_with_status_if_ended(code)
    if error_reports.should_print(os.environ, own_place=_own_place(err)):
        print(f"hpcddp: error: {err}", file=sys.stderr, flush=True)
    elif agreed:
        time.sleep(AFTER_RANK_ZERO_S)  # rank 0 prints it: its line must be out first
    # Other ranks have logged it to their own log (RUN_DIR/logs/rank-R.log) already.
    if agreed:
        _leave_now(code)


def _leave_now(code: int) -> None:
    """Exit with ``code`` before the interpreter's teardown, which puts SIGTERM back to its
    default: a rank still tearing torch down (seconds on a loaded node) when srun ends it would
    read as killed (143) instead of the failure every rank agreed on. Exit handlers, logs and
    output are finished first."""
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _own_place(err: HpcddpError) -> bool:
    """An error only this process knows (its own place in the job, its own code raising in
    training), so it prints it; not one every rank reached alike (``agreed``: rank 0 prints
    those)."""
    own = (LaunchError, HostlistError, UserCodeError)
    return isinstance(err, own) and not getattr(err, "agreed", False)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hpcddp`` console script and ``python -m hpcddp``."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "items") and all("=" in x and not x.startswith("-") for x in extra):
        args.items += extra  # key=value overrides may follow options
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.func(args)
    except HpcddpError as err:
        code = exit_status(err)
        report(err, code)
    except KeyboardInterrupt:
        print("hpcddp: interrupted", file=sys.stderr)
        code = exit_codes.INTERRUPTED
    return code


if __name__ == "__main__":
    sys.exit(main())
