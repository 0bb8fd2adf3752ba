"""What the job script does next: the one home of the requeue, restart and exclusion policy.

The batch shell (outside any container) only carries out what this torch-free helper prints on
stdout, one line, and says nothing of its own:

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
latest checkpoint with the same world size. With no spare left, the job is requeued without
the failed node instead (a broken node looks idle, so a plain rerun lands on it again).

A failure is retried (restart or requeue) at most ``slurm.max_failures`` times per job, never
for bad input (exit status 2: no node fixes that), never after a retry that gained no step (the
failure follows the job, not the node), and never when too few usable nodes would remain. A
step that stopped for the time limit and could not requeue the job itself (exit status 75, no
``scontrol`` in its container) is requeued as it is. Why, in one line, goes to stderr; each
failed attempt goes to ``RUN_DIR/attempts.jsonl`` (`hpcddp.storage.attempts`).

Usage: ``python -m hpcddp.slurm.policy first [--config=CONFIG] [key=value ...]`` and
``python -m hpcddp.slurm.policy after --status N --srun-error LINE --hosts H1,H2 --avoid LIST
--usable "n1 n2 ..." --excluded LIST [--terminated] [--check] [--config=CONFIG] [key=value ...]``
"""

import argparse
import dataclasses
import enum
import functools
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from hpcddp import exit_codes
from hpcddp.config import Config, load_config
from hpcddp.errors import HpcddpError
from hpcddp.launch import deaths, hostlist
from hpcddp.notify.notices import Notifier
from hpcddp.slurm import chain
from hpcddp.storage import attempts

FAILED = "failed"  # every failure's cause starts with it
_SRUN_ERROR = re.compile(r"^srun: error: (\S+): (tasks? [0-9,-]+): (.+)$")
_EXITED = re.compile(r"Exited with exit code (\d+)")


class Action(enum.Enum):
    """What the job script does next."""

    RUN = "run"
    REQUEUE = "requeue"
    STOP = "stop"


# What a failed attempt's record says came next, and the notice it is told with.
THEN = {Action.RUN: "restart", Action.REQUEUE: "requeue", Action.STOP: "stop"}
TOLD = {Action.RUN: "restarted", Action.REQUEUE: "requeued", Action.STOP: "failed"}


@dataclasses.dataclass(frozen=True)
class Failure:
    """What ended the step: its exit status, and where a task died first (srun's own line)."""

    status: int
    node: str = ""
    what: str = ""
    signalled: bool = False  # the first task to end was killed (Aborted, Killed ...): a death

    @classmethod
    def from_srun(cls, status: int, line: str) -> "Failure":
        """``srun: error: n2: task 3: Killed`` -> node n2, ``task 3 on n2: Killed``.

        The first rank to stop ends the others (``--kill-on-bad-exit``), whose "Terminated"
        then decides srun's status: the first one's own exit status is the step's answer.
        """
        found = _SRUN_ERROR.match(line.strip())
        if found is None:
            return cls(status, "", f"the step exited with status {status}")
        node, tasks, how = found.groups()
        exited = _EXITED.fullmatch(how)
        status = int(exited[1]) if exited else status
        return cls(status, node, f"{tasks} on {node}: {how}", deaths.killed_by_signal(how))

    @classmethod
    def from_hang(cls, status: int, verdict: Mapping[str, Any]) -> "Failure":
        """The hang watchdog's verdict (`hpcddp.comm.watchdog`) names the node, not srun: a
        rank too stuck to end itself is ended by another, whose node srun then names."""
        hosts = list(verdict.get("hosts", []))
        ranks = ",".join(str(r) for r in verdict.get("ranks", []))
        where = f" on {hosts[0]}" if len(hosts) == 1 else ""
        return cls(status, hosts[0] if len(hosts) == 1 else "", f"rank {ranks}{where}: hung")


@dataclasses.dataclass(frozen=True)
class Decision:
    """The next action; ``hosts`` to run on or ``exclude`` to requeue without; ``message``
    says why, for the job's output ("" when there is nothing to say)."""

    action: Action
    message: str = ""
    status: int = 0  # the job's exit status, when it ends or is requeued
    hosts: tuple[str, ...] = ()  # (): all of the job's nodes
    avoid: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    cancel: tuple[str, ...] = ()  # a chain's links left, when the run ended for good

    def as_output(self) -> str:
        """What the job script reads: ``run n1,n3 n2``, ``requeue 137 n2,n5``, ``stop 2 7,8``."""
        if self.action is Action.RUN:
            return f"run {','.join(self.hosts) or 'all'} {','.join(self.avoid)}".rstrip()
        if self.action is Action.REQUEUE:
            return f"requeue {self.status} {','.join(self.exclude)}".rstrip()
        return f"stop {self.status} {','.join(self.cancel)}".rstrip()


@dataclasses.dataclass(frozen=True)
class Situation:
    """The job's state as the script and the run directory describe it."""

    job: str
    max_failures: int
    earlier: list[dict[str, Any]]  # this job's earlier attempts (`attempts.history` entries)
    gained: int  # steps this attempt saved (beyond where the last recorded one ended)
    excluded: tuple[str, ...]  # nodes the job avoids already (Slurm's ExcNodeList)
    usable: tuple[str, ...] | None  # nodes of the partition that answer; None: unknown
    allocation: tuple[str, ...]  # the job's nodes, in Slurm's order
    spare_nodes: int  # how many of them were held in reserve (slurm.spare_nodes)
    avoid: tuple[str, ...] = ()  # nodes of the allocation that failed in this job

    @property
    def needed(self) -> int:
        """Nodes a step runs on: the allocation without its spares."""
        return max(len(self.allocation) - self.spare_nodes, 1)


def first_hosts(allocation: Sequence[str], spare_nodes: int) -> Decision:
    """Before the first step: the first N nodes of the allocation, the last K kept in reserve."""
    if spare_nodes and len(allocation) <= spare_nodes:
        return Decision(
            Action.STOP,
            status=exit_codes.USAGE,
            message=f"hpcddp: the job has {len(allocation)} node(s), none left to train on beside "
            f"slurm.spare_nodes={spare_nodes}. HINT: ask for nodes + spare nodes (sbatch "
            f"--nodes={len(allocation) + 1} or more), or lower slurm.spare_nodes.",
        )
    if not spare_nodes:
        return Decision(Action.RUN)
    return Decision(Action.RUN, hosts=tuple(allocation[: len(allocation) - spare_nodes]))


def after_step(failure: Failure, now: Situation, *, terminated: bool, training: bool) -> Decision:
    """After a step ended: stop, requeue (with or without exclusion) or run again. The rules,
    in order: see the module docstring."""
    if failure.status == exit_codes.OK or terminated or not training:
        return Decision(Action.STOP, status=failure.status)
    if failure.status == exit_codes.STOPPED_NOT_REQUEUED:
        return Decision(
            Action.REQUEUE,
            f"hpcddp: the step stopped to be requeued; requeueing job {now.job}",
            status=failure.status,
        )
    return after_failure(failure, now)


def after_failure(failure: Failure, now: Situation) -> Decision:
    """A rank died: restart on a spare, requeue without the node, or stop and say why."""
    stop = functools.partial(_stop, failure)
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
    count = f"failure {failures + 1} of at most {now.max_failures}; this attempt saved "
    count += f"{now.gained} steps"
    restart = _restart(failure, now, count)
    return restart if restart is not None else _requeue(failure, now, count)


def _stop(failure: Failure, why: str) -> Decision:
    return Decision(Action.STOP, f"hpcddp: {failure.what}; not retried: {why}", failure.status)


def _restart(failure: Failure, now: Situation, count: str) -> Decision | None:
    """The step again on the healthy nodes of the allocation, a spare taking the failed
    node's place; None when the healthy nodes are too few (no spare left)."""
    if not now.spare_nodes:
        return None
    avoid = tuple(dict.fromkeys([*now.avoid, *([failure.node] if failure.node else [])]))
    healthy = [host for host in now.allocation if host not in avoid]
    if len(healthy) < now.needed:
        return None
    hosts = tuple(healthy[: now.needed])
    without = f" without {','.join(avoid)}" if avoid else ""
    return Decision(
        Action.RUN,
        f"hpcddp: {failure.what}; restarting in job {now.job} on {','.join(hosts)}{without} "
        f"({count})",
        hosts=hosts,
        avoid=avoid,
    )


def _requeue(failure: Failure, now: Situation, count: str) -> Decision:
    """The job back in the queue without the nodes that failed, if enough usable ones remain."""
    failed = [*now.avoid, *([failure.node] if failure.node else [])]
    exclude = tuple(sorted({*now.excluded, *failed}))
    if now.usable is not None:
        left = sorted(set(now.usable) - set(exclude))
        if len(left) < len(now.allocation):
            return _stop(
                failure,
                f"without {','.join(exclude)} the partition has {len(left)} usable node(s) for a "
                f"job of {len(now.allocation)} (resubmit with --exclude={','.join(exclude)} when "
                "more are up, or fewer --nodes)",
            )
    without = f" without {','.join(exclude)}" if exclude else ""
    return Decision(
        Action.REQUEUE,
        f"hpcddp: {failure.what}; requeueing job {now.job}{without} ({count})",
        status=failure.status,
        exclude=exclude,
    )


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
    usable = tuple(args.usable.split()) if args.usable.strip() else None
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
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hpcddp.slurm.policy")
    parser.add_argument("when", choices=("first", "after"))
    parser.add_argument("--status", type=int, default=0)
    parser.add_argument("--srun-error", default="")
    parser.add_argument("--hosts", default="")
    parser.add_argument("--avoid", default="")
    parser.add_argument("--usable", default="")
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
    if config.slurm.chain > 1 and not args.check:
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
    if config.slurm.chain <= 1:
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
    failure = Failure.from_srun(args.status, args.srun_error)
    quiet = failure.status in (exit_codes.OK, exit_codes.STOPPED_NOT_REQUEUED) or args.terminated
    if quiet or args.check:
        return after_step(
            failure, _no_situation(environ), terminated=args.terminated, training=not args.check
        )
    try:
        config = load_config(args.config, args.overrides)
        now = situation(config, args, environ)
    except (HpcddpError, OSError) as err:
        return _stop(failure, str(err))
    restart = int(environ.get("SLURM_RESTART_COUNT") or 0)
    verdict = attempts.take_hang_verdict(config.run.dir, now.job, restart)
    if verdict is not None:
        failure = Failure.from_hang(failure.status, verdict)
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
        ),
    )
    _tell(config, environ, decision, failure if verdict else None)
    return decision


def _tell(
    config: Config, environ: Mapping[str, str], decision: Decision, hang: Failure | None
) -> None:
    """notify.url: a rank's failure as only this shell sees it (rank 0 may be dead): a hang,
    then what follows. Waits a short grace for the posts to leave, never for an answer."""
    notifier = Notifier(config, environ, speaks=True)
    step = attempts.saved_step(config.run.dir)
    if hang is not None:
        notifier.tell("hang", step, hang.what)
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
