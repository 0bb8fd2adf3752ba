"""The job script's quick question, answered without a config or the run directory (a blink):
what a signal that came while no step ran means. It prints one line the shell carries out:
``run`` (start the next step as decided) or ``stop STATUS`` (end the job with that status).

Usage: ``python -m hpcddp.resilience between-steps --status N SIGNAL...``
"""

import argparse
import sys
from collections.abc import Sequence

from hpcddp import exit_codes
from hpcddp.resilience import rules


def main(argv: Sequence[str] | None = None) -> int:
    """Print the decision on stdout."""
    parser = argparse.ArgumentParser(prog="python -m hpcddp.resilience")
    parser.add_argument("question", choices=("between-steps",))
    parser.add_argument("--status", type=int, default=0, help="the last step's exit status")
    parser.add_argument("signals", nargs="*", help="the signals that came (TERM, USR2 ...)")
    args = parser.parse_intermixed_args(argv)
    decision = rules.between_steps(args.signals, args.status)
    print("run" if decision.action is rules.Action.RUN else decision.as_output(), flush=True)
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
