"""Which node an NCCL hang is blamed on: the rank behind in the flight recorder's dumps.

Under NCCL a hung rank does not die. Its peers wait in the collective it never joined until
NCCL's watchdog aborts *them* (SIGABRT), so srun's first failed task, which the job script
excludes, is a healthy waiter, and the retry lands on the hung node again. Every rank's
flight recorder (`hpcddp.comm.flight_recorder`) dumps its last collectives on that timeout;
each collective of a group has a sequence id, counted alike on every rank, so the rank whose
last one in the default group is the lowest is the one that never arrived.

`behind` is the rule: pure, no threads, no clocks, no torch. `take` reads an attempt's dumps
and moves them beside its hang stacks (the caller names that folder), so a later
failure of the same job is never blamed on them; `host_of` reads a rank's node from its log.
"""

import ast
import dataclasses
import io
import os
import pathlib
import pickle
import re
from collections.abc import Mapping
from typing import Any

from hpcddp.run_files import FLIGHT_RECORDER_DUMP as DUMP_PREFIX
from hpcddp.run_files import LOGS

DEFAULT_GROUP = "default_pg"
_LOG_PLACE = re.compile(r"\[rank (\d+)/\d+ (\S+)\]")  # `hpcddp.train.logs` prefixes every line


@dataclasses.dataclass(frozen=True)
class Dump:
    """What one rank's dump says: the ranks of its default group, its last collective there."""

    rank: int
    world: tuple[int, ...]  # () when the dump does not say
    last_collective: int  # -1: it recorded none


@dataclasses.dataclass(frozen=True)
class Blame:
    """The ranks behind (empty: the dumps do not tell), each rank's last collective, and why."""

    ranks: tuple[int, ...]
    reached: Mapping[int, int]
    why: str


def behind(dumps: Mapping[int, Dump]) -> Blame:
    """The ranks whose last collective is below the others', when every rank of the world wrote
    a dump; nobody when a rank wrote none (it may be further behind, or dead) or all agree."""
    reached = {rank: dump.last_collective for rank, dump in sorted(dumps.items())}
    if not dumps:
        return Blame((), reached, "no rank wrote a flight recorder dump")
    world = next((d.world for d in dumps.values() if d.world), ()) or tuple(range(max(dumps) + 1))
    silent = [rank for rank in world if rank not in dumps]
    if silent:
        return Blame((), reached, f"rank(s) {_list(silent)} wrote no dump")
    lowest, highest = min(reached.values()), max(reached.values())
    if lowest == highest:
        return Blame((), reached, f"every rank reached collective {highest}")
    late = tuple(rank for rank, seq in reached.items() if seq == lowest)
    return Blame(
        late,
        reached,
        f"rank(s) {_list(late)} never joined collective {lowest + 1}, which the others "
        f"reached (their last: {highest})",
    )


def _list(ranks: Any) -> str:
    return ",".join(str(r) for r in ranks)


# -- reading --------------------------------------------------------------------------------


class _PlainUnpickler(pickle.Unpickler):
    """A dump holds only dicts, lists, strings and numbers: nothing else is ever built."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight recorder dump does not hold {module}.{name}")


def parse(rank: int, data: bytes) -> Dump | None:
    """One rank's dump (torch's pickle of plain values); None when it is not one."""
    try:
        found = _PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError):
        return None
    if not isinstance(found, dict):
        return None
    groups = found.get("pg_config") or {}
    default = next(
        (
            (str(uid), cfg)
            for uid, cfg in groups.items()
            if isinstance(cfg, dict) and cfg.get("desc") == DEFAULT_GROUP
        ),
        None,
    )
    world: tuple[int, ...] = ()
    if default is not None:
        try:
            world = tuple(sorted(int(r) for r in ast.literal_eval(str(default[1].get("ranks")))))
        except (ValueError, SyntaxError, TypeError):
            world = ()
    seqs = [
        int(entry.get("collective_seq_id", -1))
        for entry in found.get("entries") or []
        if isinstance(entry, dict) and _in_default(entry, default[0] if default else None)
    ]
    return Dump(rank, world, max(seqs, default=-1))


def _in_default(entry: Mapping[str, Any], default_uid: str | None) -> bool:
    group = entry.get("process_group") or ("", "")
    name, desc = (str(group[0]), str(group[1])) if len(group) == 2 else ("", "")
    return desc == DEFAULT_GROUP or (default_uid is not None and name == default_uid)


def dump_files(folder: pathlib.Path) -> dict[int, pathlib.Path]:
    """The dumps in ``folder``, by rank (the number after the prefix)."""
    found = {}
    for path in folder.glob(f"{DUMP_PREFIX}*"):
        suffix = path.name[len(DUMP_PREFIX) :]
        if suffix.isdigit():
            found[int(suffix)] = path
    return found


def take(logs: pathlib.Path, keep_in: pathlib.Path) -> dict[int, Dump]:
    """Read the dumps in ``logs`` and move them to ``keep_in``: each attempt's dumps are read
    once, and stay where the user looks for that attempt's hang."""
    dumps = {}
    for rank, path in dump_files(logs).items():
        try:
            data = path.read_bytes()
            keep_in.mkdir(parents=True, exist_ok=True)
            path.replace(keep_in / path.name)
        except OSError:
            continue
        dump = parse(rank, data)
        if dump is not None:
            dumps[rank] = dump
    return dumps


def host_of(logs: pathlib.Path, rank: int) -> str:
    """The node ``rank`` last logged from (its log's last prefixed line); "" when unknown."""
    try:
        text = (logs / f"rank-{rank}.log").read_text(errors="replace")
    except OSError:
        return ""
    places = [m for m in _LOG_PLACE.finditer(text) if int(m.group(1)) == rank]
    return places[-1].group(2) if places else ""


def take_verdict(run_dir: str | os.PathLike[str], keep_in: pathlib.Path) -> dict[str, Any] | None:
    """A hang verdict in the watchdog's shape (`hpcddp.slurm.policy.Failure.from_hang` reads
    it) when the attempt's dumps name the ranks behind; None when there are none or they do not
    tell. The dumps move to ``keep_in`` (the attempt's hang folder) either way."""
    logs = pathlib.Path(run_dir) / LOGS
    blame = behind(take(logs, keep_in))
    if not blame.ranks:
        return None
    hosts = sorted({host for host in (host_of(logs, r) for r in blame.ranks) if host})
    return {"ranks": list(blame.ranks), "hosts": hosts, "why": blame.why, "by": "flight recorder"}
