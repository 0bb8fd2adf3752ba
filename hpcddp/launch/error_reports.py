"""Error reports that let a refusal every rank reaches be printed once, not once per rank.

Under ``hpcddp train --nproc N`` each rank writes what ended it into the file named by
`REPORT_FILE_VAR` instead of printing it; the launcher reads them all once its ranks have
exited and prints each distinct message once (`summarize`). Without our launcher, rank 0 prints and
the other ranks keep the message in their own logs (`should_print`), except for an error in
resolving the rank's own place in the job: only that rank knows it.
"""

import dataclasses
import json
import os
import pathlib
import signal
from collections.abc import Iterable, Mapping

from hpcddp.launch.contexts import claimed_rank

REPORT_FILE_VAR = "HPCDDP_REPORT_FILE"


def leave_with_status_if_ended(code: int) -> None:
    """From now on, a SIGTERM ends this process with ``code`` instead of "Terminated".

    For a failure every rank agreed on: under `srun --kill-on-bad-exit` the first rank to exit
    ends the others, which would then report a death (143) for what was one agreed error.
    """
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(code))


@dataclasses.dataclass(frozen=True)
class Report:
    """What ended one rank: its exit status and the one-line message the user should see.

    ``secondary`` marks a failure caused by another rank (a peer that died first): it is shown
    only when no rank reported a cause of its own.
    """

    rank: int
    host: str
    code: int
    message: str
    secondary: bool = False


def should_print(environ: Mapping[str, str], own_place: bool = False) -> bool:
    """Whether this process prints its own error: rank 0, a process no launcher numbered, or
    any rank whose error is about its own place in the job (``own_place``)."""
    if REPORT_FILE_VAR in environ:
        return False
    return own_place or claimed_rank(environ) in (None, 0)


def write(path: str | os.PathLike[str], report: Report) -> None:
    """Leave the report for the launcher; renamed into place, so it is read whole or not at all."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(report)))
    os.replace(tmp, path)


def read_all(paths: Iterable[pathlib.Path]) -> list[Report]:
    """The reports that were written, in rank order (missing or damaged ones are skipped)."""
    reports = []
    for path in paths:
        try:
            reports.append(Report(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(reports, key=lambda r: r.rank)


def summarize(reports: list[Report]) -> tuple[list[str], int | None]:
    """(lines to print, exit status): each distinct cause once, the lowest rank's status.

    Causes come before consequences: ranks that only lost a peer are left out when any rank
    reported a cause. A message every rank gave is printed as is; one that only some ranks gave
    names them, so a node-specific problem is not mistaken for everyone's.
    """
    causes = [r for r in reports if not r.secondary] or reports
    if not causes:
        return [], None
    everyone = len({r.rank for r in causes}) == len({r.rank for r in reports})
    lines: dict[str, list[int]] = {}
    for report in causes:
        lines.setdefault(report.message, []).append(report.rank)
    printed = []
    for message, ranks in lines.items():
        if len(lines) == 1 and everyone:
            printed.append(f"hpcddp: error: {message}")
        else:
            printed.append(f"hpcddp: error: ({_ranks(ranks)}) {message}")
    return printed, causes[0].code


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
