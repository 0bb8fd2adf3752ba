"""The job script's helper: it gathers what a decision needs and prints the decision.

The rules themselves live in `hpcddp.resilience.rules` (requeue, restart on a spare, stop);
this helper reads the job's variables, the run directory's attempts and the config, asks the
rules, records a failed attempt (its dead ranks wrote nothing), tells ``notify.url``, and
prints the decision. The batch shell (outside any container) only carries out what it prints
on stdout, one line, and says nothing of its own:

- ``run HOSTS AVOID``: start a step on HOSTS (a comma list, or ``all`` of the job's nodes);
  AVOID are the nodes this job has seen fail, for the next question;
- ``requeue STATUS [NODE,...]``: ``scontrol requeue`` the job, then ``scontrol update
  ExcNodeList=`` (Slurm refuses that while the job runs and takes it the moment the job is
  requeued); the job's exit status is STATUS;
- ``stop STATUS [JOB,...]``: end the job with that exit status (the first rank's to fail),
  after ``scancel`` of the JOBs: the links of the run's chain left once the run ended for good
  (`hpcddp.slurm.chain`).

It is asked once before the first step (``first``) and after every step (``after``). With
``slurm.spare_nodes=K`` the job holds N+K nodes: steps run on the first N healthy ones of its
node list, and a rank death restarts the step at once on the healthy nodes plus a spare, the
failed node left out, in the same job (no requeue, no queue wait); the ranks resume from the
latest checkpoint with the same world size. With no spare left and ``slurm.shrink_on_failure``,
the step restarts the same way on the nodes that remain, with fewer ranks, while they are at
least ``slurm.min_nodes``. Otherwise the job is requeued without
the failed node instead (a broken node looks idle, so a plain rerun lands on it again). Which
partition nodes count as usable for that requeue is decided from ``sinfo``'s own lines
(``--node-states``). Why, in one line, goes to stderr; each failed attempt goes to
``RUN_DIR/attempts.jsonl`` (`hpcddp.records.attempts`).

Usage: ``python -m hpcddp.slurm.policy first [--config=CONFIG] [key=value ...]`` and
``python -m hpcddp.slurm.policy after --status N --srun-errors LINES --hosts H1,H2 --avoid LIST
--node-states "n1 idle\nn2 down ..." --excluded LIST [--terminated] [--check]
[--config=CONFIG] [key=value ...]``
"""

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence

from hpcddp import exit_codes
from hpcddp.config import Config, load_config
from hpcddp.errors import HpcddpError
from hpcddp.launch import hostlist
from hpcddp.notify.notices import Notifier
from hpcddp.records import attempts, nccl_blame
from hpcddp.resilience import rules
from hpcddp.resilience.rules import (
    FAILED,
    Action,
    Decision,
    Failure,
    Shrinking,
    Situation,
    after_failure,
    after_step,
    first_hosts,
)
from hpcddp.run_events import Event
from hpcddp.slurm import chain

# What a failed attempt's record says came next, and the notice it is told with.
THEN = {Action.RUN: "restart", Action.REQUEUE: "requeue", Action.STOP: "stop"}
TOLD = {Action.RUN: Event.RESTARTED, Action.REQUEUE: Event.REQUEUED, Action.STOP: Event.FAILED}


def _hosts(expr: str) -> tuple[str, ...]:
    """A hostlist (``n[1-3]``, ``n1,n2``) or a space list, expanded; () for none or ``(null)``."""
    words = [word for word in expr.replace(" ", ",").split(",") if word]
    if not words or words == ["(null)"]:
        return ()
    return tuple(hostlist.expand(",".join(words)))


def allocation(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The job's nodes, in Slurm's order."""
    return _hosts(environ.get("SLURM_JOB_NODELIST", ""))


def situation(config: Config, args: argparse.Namespace, environ: Mapping[str, str]) -> Situation:
    """Read the run directory's attempts and the job's variables."""
    run_dir, job = config.run.dir, environ.get("SLURM_JOB_ID", "")
    usable = rules.usable_nodes(args.node_states.splitlines())
    return Situation(
        job=job,
        max_failures=config.slurm.max_failures,
        earlier=[a for a in attempts.history(run_dir) if a["job"] == job],
        gained=max(attempts.saved_step(run_dir) - attempts.last_step(run_dir), 0),
        excluded=_hosts(args.excluded),
        usable=usable,
        allocation=allocation(environ),
        spare_nodes=config.slurm.spare_nodes,
        avoid=_hosts(args.avoid),
        shrinking=Shrinking(config.slurm.min_nodes) if config.slurm.shrink_on_failure else None,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hpcddp.slurm.policy")
    parser.add_argument("when", choices=("first", "after"))
    parser.add_argument("--status", type=int, default=0)
    parser.add_argument("--srun-errors", default="", help="srun's error lines, one a line")
    parser.add_argument("--hosts", default="")
    parser.add_argument("--avoid", default="")
    parser.add_argument("--node-states", default="", help="sinfo -h -N -o '%%N %%t'")
    parser.add_argument("--excluded", default="")
    parser.add_argument("--terminated", action="store_true")
    parser.add_argument("--check", action="store_true", help="the step ran `hpcddp check`")
    parser.add_argument("--config", default=None)
    parser.add_argument("overrides", nargs="*")
    return parser


def _first(args: argparse.Namespace, environ: Mapping[str, str]) -> Decision:
    """Before the first step; a config that cannot load runs on every node, where the ranks
    report the error in full (and `after` stops)."""
    nodes = allocation(environ)
    try:
        config = load_config(args.config, args.overrides)
    except (HpcddpError, OSError):
        return Decision(Action.RUN)
    if config.slurm.chained and not args.check:
        rest, why = chain.ended_before(config.run.dir, environ.get("SLURM_JOB_ID", ""))
        if why:
            left = f"; cancelling the chain's links left: {','.join(rest)}" if rest else ""
            return Decision(Action.STOP, f"hpcddp: {why}; nothing to do{left}", cancel=rest)
    return first_hosts(nodes, config.slurm.spare_nodes)


def _after(args: argparse.Namespace, environ: Mapping[str, str]) -> Decision:
    """After a step, with the chain's links left to cancel when the job stops for good."""
    decision = _after_step(args, environ)
    if decision.action is not Action.STOP or args.check:
        return decision
    try:
        config = load_config(args.config, args.overrides)
    except (HpcddpError, OSError):
        return decision
    if not config.slurm.chained:
        return decision
    job = environ.get("SLURM_JOB_ID", "")
    rest, why = chain.rest_to_cancel(
        config.run.dir, job, decision.status, terminated=args.terminated
    )
    if not rest:
        return decision
    said = f"{decision.message}\n" if decision.message else ""
    message = f"{said}hpcddp: {why}; cancelling the chain's links left: {','.join(rest)}"
    return dataclasses.replace(decision, message=message, cancel=rest)


def _after_step(args: argparse.Namespace, environ: Mapping[str, str]) -> Decision:
    """After a step; a failure's attempt is recorded, since its dead ranks wrote nothing."""
    failure = Failure.from_srun(args.status, args.srun_errors)
    quiet = failure.status in (exit_codes.OK, exit_codes.STOPPED_NOT_REQUEUED) or args.terminated
    if quiet or args.check:
        return after_step(
            failure, _no_situation(environ), terminated=args.terminated, training=not args.check
        )
    try:
        config = load_config(args.config, args.overrides)
        now = situation(config, args, environ)
    except (HpcddpError, OSError) as err:
        return rules.not_retried(failure, str(err))
    restart = int(environ.get("SLURM_RESTART_COUNT") or 0)
    # Who is to blame for a hang, before the rules are asked: the watchdog's verdict names the
    # node; else, under NCCL, the flight-recorder dumps name the rank behind.
    verdict = attempts.take_hang_verdict(config.run.dir, now.job, restart)
    if verdict is not None:
        failure = Failure.from_hang(failure.status, verdict)
    elif nccl := nccl_blame.take_verdict(
        config.run.dir, attempts.hang_dir(config.run.dir, now.job, restart)
    ):
        failure = Failure.from_hang(failure.status, nccl)  # NCCL aborted the waiters, not it
    decision = after_failure(failure, now)
    os.makedirs(config.run.dir, exist_ok=True)  # the ranks may have died before making it
    attempts.record(
        config.run.dir,
        attempts.Ended(
            job=now.job,
            restart=restart,
            nodes=list(now.allocation if args.hosts in ("", "all") else _hosts(args.hosts)),
            cause=f"{FAILED}: {failure.what}",
            excluded=list(decision.avoid or decision.exclude),
            then=THEN[decision.action],
            times={"detected": verdict["detected"]} if verdict else None,
            size={"allocated_nodes": len(now.allocation)} if now.allocation else None,
            shrank=_shrank(decision),
        ),
    )
    _tell(config, environ, decision, failure if verdict else None)
    return decision


def _shrank(decision: Decision) -> dict[str, int] | None:
    """How far the job shrank for its next step, for its attempt's record; None: it did not."""
    if not decision.shrank:
        return None
    before, after = decision.shrank
    return {"from_nodes": before, "to_nodes": after}


def _tell(
    config: Config, environ: Mapping[str, str], decision: Decision, hang: Failure | None
) -> None:
    """notify.url: a rank's failure as only this shell sees it (rank 0 may be dead): a hang,
    then what follows. Waits a short grace for the posts to leave, never for an answer."""
    notifier = Notifier(config, environ, speaks=True)
    step = attempts.saved_step(config.run.dir)
    if hang is not None:
        notifier.tell(Event.HANG, step, hang.what)
    notifier.tell(TOLD[decision.action], step, decision.message.removeprefix("hpcddp: "))
    notifier.close()


def _no_situation(environ: Mapping[str, str]) -> Situation:
    """Enough of a situation for the decisions that need no config (success, preemption)."""
    job = environ.get("SLURM_JOB_ID", "")
    return Situation(job, 0, [], 0, (), None, allocation(environ), 0)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """Print the decision on stdout and why on stderr."""
    args = _parser().parse_intermixed_args(argv)
    decision = _first(args, environ) if args.when == "first" else _after(args, environ)
    if decision.message:
        print(decision.message, file=sys.stderr, flush=True)
    print(decision.as_output(), flush=True)
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
