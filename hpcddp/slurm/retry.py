"""After a rank died: requeue the job without the node it died on, or say why not.

A broken node looks idle, so a job that simply runs again lands on it again (black-hole
nodes). The job script runs this helper when its step failed (not for a preemption, which
requeues by itself), then does what it prints on stdout, ``requeue NODE,...`` or ``stop``,
with Slurm's tools, outside any container: ``scontrol requeue`` first, then
``scontrol update ExcNodeList=...`` (Slurm refuses that while the job runs and accepts it the
moment the job is requeued). Why, in one line, goes to stderr; the attempt's end goes to
``RUN_DIR/attempts.jsonl`` (`hpcddp.storage.attempts`), so the run's summary lists it.

The job is requeued at most ``slurm.max_failures`` times, never for bad input (exit status 2:
no node fixes that), never after a retry that gained no step (the failure follows the job, not
the node), and never when too few usable nodes would remain.

Usage (from the job script): ``python -m hpcddp.slurm.retry --status N --srun-error LINE
--usable "n1 n2 ..." --excluded LIST [--config=CONFIG] [key=value ...]``
"""

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from hpcddp import exit_codes
from hpcddp.config import load_config
from hpcddp.errors import HpcddpError
from hpcddp.launch import deaths, hostlist
from hpcddp.storage import attempts

FAILED = "failed"  # every failure's cause starts with it
_SRUN_ERROR = re.compile(r"^srun: error: (\S+): (tasks? [0-9,-]+): (.+)$")


@dataclasses.dataclass(frozen=True)
class Failure:
    """What ended the step: its exit status, and where a task died first (srun's own line)."""

    status: int
    node: str = ""
    what: str = ""
    signalled: bool = False  # the first task to end was killed (Aborted, Killed ...): a death

    @classmethod
    def from_srun(cls, status: int, line: str) -> "Failure":
        """``srun: error: n2: task 3: Killed`` -> node n2, ``task 3 on n2: Killed``."""
        found = _SRUN_ERROR.match(line.strip())
        if found is None:
            return cls(status, "", f"the step exited with status {status}")
        node, tasks, how = found.groups()
        return cls(status, node, f"{tasks} on {node}: {how}", deaths.killed_by_signal(how))


@dataclasses.dataclass(frozen=True)
class Decision:
    """Requeue (without ``exclude``) or stop; ``message`` says why, for the job's output."""

    requeue: bool
    exclude: tuple[str, ...]
    message: str

    def as_output(self) -> str:
        """What the job script reads: ``requeue n2,n5`` or ``stop``."""
        return f"requeue {','.join(self.exclude)}".rstrip() if self.requeue else "stop"


@dataclasses.dataclass(frozen=True)
class Situation:
    """The job's state as the script and the run directory describe it."""

    job: str
    max_failures: int
    earlier: list[dict[str, Any]]  # this job's earlier attempts (`attempts.history` entries)
    gained: int  # steps this attempt saved (beyond where the last recorded one ended)
    excluded: tuple[str, ...]  # nodes the job avoids already
    usable: tuple[str, ...] | None  # nodes of the partition that answer; None: unknown
    needed: int  # nodes the job runs on


def decide(failure: Failure, now: Situation) -> Decision:
    """The rules, in order; see the module docstring."""

    def stop(why: str) -> Decision:
        return Decision(False, (), f"hpcddp: {failure.what}; not requeued: {why}")

    failures = sum(1 for a in now.earlier if str(a.get("cause", "")).startswith(FAILED))
    if failure.status == exit_codes.USAGE and not failure.signalled:
        return stop("bad input fails on every node (fix the error above, then resubmit)")
    if now.max_failures == 0:
        return stop("slurm.max_failures=0")
    if failures >= now.max_failures:
        return stop(f"the job failed {failures + 1} times (slurm.max_failures={now.max_failures})")
    previous = now.earlier[-1] if now.earlier else {}
    if str(previous.get("cause", "")).startswith(FAILED) and now.gained == 0:
        return stop(
            "this retry gained no step since the last failure: the fault follows the job, not "
            "a node (look for the first error above)"
        )
    exclude = tuple(sorted({*now.excluded, *([failure.node] if failure.node else [])}))
    if now.usable is not None:
        left = sorted(set(now.usable) - set(exclude))
        if len(left) < now.needed:
            return stop(
                f"without {','.join(exclude)} the partition has {len(left)} usable node(s) for a "
                f"job of {now.needed} (resubmit with --exclude={','.join(exclude)} when more "
                "are up, or fewer --nodes)"
            )
    without = f" without {','.join(exclude)}" if exclude else ""
    return Decision(
        True,
        exclude,
        f"hpcddp: {failure.what}; requeueing job {now.job}{without} (failure {failures + 1} of "
        f"at most {now.max_failures}; this attempt saved {now.gained} steps)",
    )


def _hosts(expr: str) -> tuple[str, ...]:
    expr = expr.strip()
    if not expr or expr == "(null)":
        return ()
    return tuple(hostlist.expand(expr))


def situation(
    run_dir: str, max_failures: int, args: argparse.Namespace, environ: Mapping[str, str]
) -> Situation:
    """Read the run directory's attempts and the job's variables."""
    job = environ.get("SLURM_JOB_ID", "")
    nodes = _hosts(environ.get("SLURM_JOB_NODELIST", ""))
    usable = tuple(args.usable.split()) if args.usable.strip() else None
    return Situation(
        job=job,
        max_failures=max_failures,
        earlier=[a for a in attempts.history(run_dir) if a["job"] == job],
        gained=max(attempts.saved_step(run_dir) - attempts.last_step(run_dir), 0),
        excluded=_hosts(args.excluded),
        usable=usable,
        needed=int(environ.get("SLURM_JOB_NUM_NODES") or len(nodes) or 1),
    )


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """Print the decision on stdout and why on stderr; record the attempt's end."""
    parser = argparse.ArgumentParser(prog="python -m hpcddp.slurm.retry")
    parser.add_argument("--status", type=int, required=True)
    parser.add_argument("--srun-error", default="")
    parser.add_argument("--usable", default="")
    parser.add_argument("--excluded", default="")
    parser.add_argument("--config", default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    failure = Failure.from_srun(args.status, args.srun_error)
    try:
        config = load_config(args.config, args.overrides)
        now = situation(config.run.dir, config.slurm.max_failures, args, environ)
    except (HpcddpError, OSError) as err:
        print(f"hpcddp: {failure.what}; not requeued: {err}", file=sys.stderr)
        print("stop")
        return exit_codes.OK
    decision = decide(failure, now)
    os.makedirs(config.run.dir, exist_ok=True)  # the ranks may have died before making it
    attempts.record(
        config.run.dir,
        job=now.job,
        restart=int(environ.get("SLURM_RESTART_COUNT") or 0),
        nodes=list(_hosts(environ.get("SLURM_JOB_NODELIST", ""))),
        cause=f"{FAILED}: {failure.what}",
        excluded=list(decision.exclude),
    )
    print(decision.message, file=sys.stderr, flush=True)
    print(decision.as_output(), flush=True)
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
