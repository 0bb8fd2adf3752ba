"""The rules of how a run ends: frozen facts in, a frozen `Decision` out; no clocks, files or
subprocesses, so every rule is a line of a table a test can read.

When each rule is asked, and by whom:

- before the first step (the job script): `first_hosts`, the nodes of the first step;
- after a step ended (the job script): `after_step`, and `after_failure` for a rank's death:
  a failure is retried (restart on a spare; else, with ``slurm.shrink_on_failure``, restart
  on the nodes that remain if they are at least ``slurm.min_nodes``; else requeue without its
  node) at most
  ``slurm.max_failures`` times per job, never for bad input (exit status 2: no node fixes
  that), never after a retry that gained no step (the fault follows the job, not the node), and
  never when too few usable nodes would remain; a step that stopped for the time limit but could
  not requeue the job itself (exit status 75, no ``scontrol`` in its container) is requeued;
- between two steps (the job script): `between_steps`, a SIGTERM (scancel, a requeue) ends the
  job; and `usable_nodes`, which states of ``sinfo`` a requeued job can land on;
- after a stop (every rank of the trainer): `after_stop`, a preempted run requeues, or hands
  on to its chain's next link (a requeued link would queue again ahead of that link), unless
  the stop time passed within the attempt's first step (a requeue would gain one step);
- after a link of a chain ended: `why_cancel`, whether the links left are cancelled;
- a signal outside training (submitit's checkpoint hook): `outside_training`.
"""

import dataclasses
import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hpcddp import exit_codes
from hpcddp.outcome import StopReason

FAILED = "failed"  # every failure's cause starts with it
_SRUN_ERROR = re.compile(r"^srun: error: (\S+): (tasks? [0-9,-]+): (.+)$")
_EXITED = re.compile(r"Exited with exit code (\d+)")


class Action(enum.Enum):
    """What comes next."""

    RUN = "run"  # a step on the given nodes, in the same job
    REQUEUE = "requeue"  # the job back in the queue; it resumes from the checkpoint
    HAND_ON = "hand_on"  # this link of a chain ends; the next link resumes
    STOP = "stop"  # the job ends with `Decision.status`


@dataclasses.dataclass(frozen=True)
class Failure:
    """What ended the step: its exit status, and where a task died first (srun's own line)."""

    status: int
    node: str = ""
    what: str = ""
    signalled: bool = False  # the first task to end was killed (Aborted, Killed ...): a death

    @classmethod
    def from_srun(cls, status: int, errors: str) -> "Failure":
        """The cause among srun's error lines in ``errors``: the first line of a task that did
        not only lose a peer (``srun: error: n2: task 3: Killed`` -> node n2, ``task 3 on n2:
        Killed``).

        The first rank to stop ends the others (``--kill-on-bad-exit``), whose "Terminated"
        then decides srun's status: the cause's own exit status is the step's answer. srun
        prints the lines in the order it hears of the ends, not the order they happened, so a
        survivor's ``exit code 3`` (`exit_codes.PEER_LOST`) may come first; it is passed over.
        """
        matches = (_SRUN_ERROR.match(line.strip()) for line in errors.splitlines())
        found = [cls._from_match(status, match) for match in matches if match]
        causes = [f for f in found if f.status != exit_codes.PEER_LOST] or found
        if causes:
            return causes[0]
        return cls(status, "", f"the step exited with status {status}")

    @classmethod
    def _from_match(cls, status: int, line: re.Match[str]) -> "Failure":
        node, tasks, how = line.groups()
        exited = _EXITED.fullmatch(how)
        status = int(exited[1]) if exited else status
        return cls(status, node, f"{tasks} on {node}: {how}", _killed_by_signal(how))

    @classmethod
    def from_hang(cls, status: int, verdict: Mapping[str, Any]) -> "Failure":
        """The hang watchdog's verdict (`hpcddp.comm.watchdog`) names the node, not srun: a
        rank too stuck to end itself is ended by another, whose node srun then names."""
        hosts = list(verdict.get("hosts", []))
        ranks = ",".join(str(r) for r in verdict.get("ranks", []))
        where = f" on {hosts[0]}" if len(hosts) == 1 else ""
        return cls(status, hosts[0] if len(hosts) == 1 else "", f"rank {ranks}{where}: hung")


def _killed_by_signal(srun_how: str) -> bool:
    """Whether srun's word for how a task ended (``Aborted``, ``Killed``, ``Exited with exit
    code 2``...) is a signal rather than an exit status: a signal is a death, never bad input
    (NCCL's watchdog aborts a rank; a survivor's later status 2 must not decide)."""
    how = srun_how.strip()
    return bool(how) and not how.startswith("Exited with exit code")


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
    shrank: tuple[int, ...] = ()  # (nodes before, nodes after) when a run goes on with fewer

    @property
    def refused(self) -> bool:
        """A stop for bad input: the caller raises it as a configuration error."""
        return self.action is Action.STOP and self.status == exit_codes.USAGE

    def as_output(self) -> str:
        """What the job script reads: ``run n1,n3 n2``, ``requeue 137 n2,n5``, ``stop 2 7,8``
        (a hand-on ends the job as a stop does: the next link is already queued)."""
        if self.action is Action.RUN:
            return f"run {','.join(self.hosts) or 'all'} {','.join(self.avoid)}".rstrip()
        if self.action is Action.REQUEUE:
            return f"requeue {self.status} {','.join(self.exclude)}".rstrip()
        return f"stop {self.status} {','.join(self.cancel)}".rstrip()


@dataclasses.dataclass(frozen=True)
class Shrinking:
    """``slurm.shrink_on_failure``: with no spare left, a run goes on with the nodes that
    remain, never fewer than ``min_nodes`` (0: all the nodes a step runs on, so never)."""

    min_nodes: int = 0


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
    shrinking: Shrinking | None = None  # None: never go on with fewer nodes

    @property
    def needed(self) -> int:
        """Nodes a step runs on: the allocation without its spares."""
        return max(len(self.allocation) - self.spare_nodes, 1)


# -- before the first step ----------------------------------------------------------------------


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


# -- after a step (the job script) --------------------------------------------------------------


def after_step(failure: Failure, now: Situation, *, terminated: bool, training: bool) -> Decision:
    """After a step ended: stop, requeue (with or without exclusion) or run again."""
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
    failures = sum(1 for a in now.earlier if str(a.get("cause", "")).startswith(FAILED))
    if failure.status == exit_codes.USAGE and not failure.signalled:
        why = "bad input fails on every node (fix the error above, then resubmit)"
        return not_retried(failure, why)
    if now.max_failures == 0:
        return not_retried(failure, "slurm.max_failures=0")
    if failures >= now.max_failures:
        why = f"the job failed {failures + 1} times (slurm.max_failures={now.max_failures})"
        return not_retried(failure, why)
    previous = now.earlier[-1] if now.earlier else {}
    if str(previous.get("cause", "")).startswith(FAILED) and now.gained == 0:
        return not_retried(
            failure,
            "this retry gained no step since the last failure: the fault follows the job, not "
            "a node (look for the first error above)",
        )
    count = f"failure {failures + 1} of at most {now.max_failures}; this attempt saved "
    count += f"{now.gained} steps"
    restart = _restart(failure, now, count) or _shrink(failure, now, count)
    return restart if restart is not None else _requeue(failure, now, count)


def not_retried(failure: Failure, why: str) -> Decision:
    """Stop after a failure, saying why it is not retried."""
    return Decision(Action.STOP, f"hpcddp: {failure.what}; not retried: {why}", failure.status)


def _restart(failure: Failure, now: Situation, count: str) -> Decision | None:
    """The step again on the healthy nodes of the allocation, a spare taking the failed
    node's place; None when the healthy nodes are too few (no spare left)."""
    if not now.spare_nodes:
        return None
    avoid = _failed_nodes(failure, now)
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


def _shrink(failure: Failure, now: Situation, count: str) -> Decision | None:
    """The step again on every healthy node left, fewer than before (the ranks resume at the
    smaller world size, the global batch kept by `hpcddp.train.resharding`); None when
    shrinking is off, no node was lost (srun named none), or fewer than the floor would remain."""
    if now.shrinking is None:
        return None
    avoid = _failed_nodes(failure, now)
    before = min(len([h for h in now.allocation if h not in now.avoid]), now.needed)
    hosts = tuple(host for host in now.allocation if host not in avoid)[: now.needed]
    floor = now.shrinking.min_nodes or now.needed
    if len(hosts) < floor or len(hosts) >= before:
        return None
    return Decision(
        Action.RUN,
        f"hpcddp: {failure.what}; no spare left, shrinking from {before} to {len(hosts)} "
        f"node(s) (slurm.min_nodes={floor}): restarting in job {now.job} on {','.join(hosts)} "
        f"without {','.join(avoid)} ({count})",
        hosts=hosts,
        avoid=avoid,
        shrank=(before, len(hosts)),
    )


def _failed_nodes(failure: Failure, now: Situation) -> tuple[str, ...]:
    """The nodes of the allocation this job has seen fail, this failure's included, once each."""
    return tuple(dict.fromkeys([*now.avoid, *([failure.node] if failure.node else [])]))


def _requeue(failure: Failure, now: Situation, count: str) -> Decision:
    """The job back in the queue without the nodes that failed, if enough usable ones remain."""
    failed = [*now.avoid, *([failure.node] if failure.node else [])]
    exclude = tuple(sorted({*now.excluded, *failed}))
    if now.usable is not None:
        left = sorted(set(now.usable) - set(exclude))
        if len(left) < len(now.allocation):
            return not_retried(
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


# -- between two steps (the job script) ---------------------------------------------------------

# sinfo's short states (%t) a requeued job may be given: up, whether busy or not. A suffix
# (``idle*``: not responding, ``mix-``: planned) does not change the word they start with.
USABLE_STATES = ("idle", "mix", "alloc", "comp")


def usable_nodes(sinfo_lines: Iterable[str]) -> tuple[str, ...] | None:
    """The nodes in a usable state, from ``sinfo -h -N -o '%N %t'`` lines, sorted, once each;
    None (unknown) when none is: a partition seen with no node up is more likely a failed
    look than a fact, and the requeued job waits in the queue for nodes anyway."""
    usable = set()
    for line in sinfo_lines:
        words = line.split()
        if len(words) >= 2 and words[1].startswith(USABLE_STATES):
            usable.add(words[0])
    return tuple(sorted(usable)) or None


def between_steps(signals: Iterable[str], status: int) -> Decision:
    """A signal that came while no step ran: SIGTERM (scancel, or a requeue ending the job)
    ends the job with the last step's status; any other (SIGUSR2, the time-limit warning) lets
    the next step start, which reads the job's end itself."""
    if "TERM" in {name.upper().removeprefix("SIG") for name in signals}:
        return Decision(Action.STOP, status=status)
    return Decision(Action.RUN)


# -- after a stop (every rank of the trainer) ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Stopped:
    """A run that stopped before its end, after its stop checkpoint."""

    reason: StopReason
    step: int  # the step it stopped at
    resumed_step: int  # the step this attempt started from
    deadline_passed: bool  # the stop time ahead of the job's time limit had passed
    margin_s: float  # train.stop_before_end_s


@dataclasses.dataclass(frozen=True)
class ChainPlace:
    """Where this job sits in its run's chain (`hpcddp.records.chain_record`)."""

    name: str
    size: int  # slurm.chain
    where: int  # this job's link, from 1
    submitted: int  # links submitted so far
    last_job: str  # the last submitted link's job id


def no_room_message(margin_s: float) -> str:
    """Why a job that reached its stop time within its first step is not requeued."""
    return (
        f"the job's time limit passed its stop point (train.stop_before_end_s={margin_s:.0f} s "
        "before the end) before the attempt's first step ended: requeueing would gain one step "
        "per attempt. HINT: ask for more time (--time, slurm.time_min), or lower "
        "train.stop_before_end_s; the checkpoint is kept, so re-running resumes."
    )


def after_stop(stop: Stopped, link: ChainPlace | None = None) -> Decision:
    """After the stop checkpoint: requeue a preempted job, hand on to the chain's next link,
    or stop. ``link`` is read only when the answer depends on it (a preempted run)."""
    if stop.reason is not StopReason.PREEMPTED:
        return Decision(Action.STOP)
    if stop.deadline_passed and stop.step - stop.resumed_step <= 1:
        return Decision(Action.STOP, no_room_message(stop.margin_s), status=exit_codes.USAGE)
    if link is None:
        return Decision(Action.REQUEUE)
    if link.where == link.submitted:
        return Decision(
            Action.HAND_ON,
            f"job {link.last_job} is the last link ({link.where} of {link.size}) of chain "
            f"{link.name}, not requeued. HINT: submit the same command again to resume.",
        )
    return Decision(
        Action.HAND_ON,
        f"link {link.where} of {link.size} of chain {link.name} ends; the next link resumes",
    )


def outside_training(*, chained: bool) -> Decision:
    """A stop signal outside the training loop (submitit's checkpoint hook): requeue, then
    resume; a chain's link is not requeued, its next link resumes."""
    return Decision(Action.HAND_ON if chained else Action.REQUEUE)


# -- after a link of a chain ended --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LinkEnd:
    """How one link's training ended, as the job script and the run directory tell it."""

    status: int  # the job's exit status, as the policy decided it
    terminated: bool = False  # SIGTERM: scancel, or the time limit's hard end
    ended: str = ""  # "completed", "failed (...)" or "": what a fresh summary.json says
    cause: str = ""  # why rank 0 says the link's last attempt ended ("preempted", ...)


def why_cancel(end: LinkEnd) -> str:
    """Why the links left are cancelled after this end; "" when the next link carries on."""
    if end.ended:
        return f"the run {end.ended}"
    if end.terminated:
        return ""  # scancel of this link, or its time ran out before it stopped: resume
    if end.status == exit_codes.OK and end.cause == "preempted":
        return ""  # stopped at its time limit with a checkpoint: the next link resumes
    if end.status == exit_codes.OK:
        return f"the run stopped ({end.cause or 'on request'})"
    return f"the run failed with status {end.status} and is not retried"
