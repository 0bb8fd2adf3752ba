"""``hpcddp report RUN_DIR|SWEEP_DIR``: what a run, or each run of a sweep, cost.

A run directory is one that holds ``attempts.jsonl``; a sweep directory holds run directories
(one per point, at any depth up to `SWEEP_DEPTH`), found by that file alone, so a sweep made
by any tool is reported alike. Figures come from what each run recorded
(`hpcddp.records.cost`); where Slurm accounting answers (`hpcddp.slurm.accounting`), each
attempt's Slurm run is shown beside them: its state, elapsed time and nodes.
"""

import dataclasses
import json
import pathlib
import re
from typing import Any

from hpcddp.errors import ConfigError
from hpcddp.records import attempts
from hpcddp.records.cost import AttemptCost, Totals, run_costs
from hpcddp.slurm import accounting
from hpcddp.slurm.queue import Runner

SWEEP_DEPTH = 2


@dataclasses.dataclass(frozen=True)
class RunReport:
    """One run: its attempts costed, and Slurm's account of each (None where it has none)."""

    run_dir: pathlib.Path
    costs: list[AttemptCost]
    slurm: list[accounting.JobRun | None]

    @property
    def totals(self) -> Totals:
        """The run's attempts added up."""
        return Totals.of(self.costs)

    def as_dict(self) -> dict[str, Any]:
        """The run for ``--json``: each attempt with its ``slurm`` account (or null)."""
        rows = [
            {**cost.as_dict(), "slurm": dataclasses.asdict(found) if found else None}
            for cost, found in zip(self.costs, self.slurm, strict=True)
        ]
        return {"run_dir": str(self.run_dir), "attempts": rows, "totals": self.totals.as_dict()}


def run_dirs(path: pathlib.Path) -> list[pathlib.Path]:
    """``path`` if it is a run directory, else the run directories under it, in natural order."""
    if (path / attempts.FILE).is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(
            f"{path} is not a directory. HINT: give a run directory (run.dir) or a sweep's."
        )
    found = [
        p.parent
        for depth in range(1, SWEEP_DEPTH + 1)
        for p in path.glob("/".join(["*"] * depth) + "/" + attempts.FILE)
    ]
    if not found:
        raise ConfigError(
            f"{path} holds no run: no {attempts.FILE} in it or in the folders below it. "
            "HINT: give a run directory (run.dir) whose run has ended at least one attempt."
        )
    return sorted(set(found), key=_natural)


def _natural(path: pathlib.Path) -> list[Any]:
    """point-2 before point-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def reports(path: pathlib.Path, run: Runner | None = None) -> tuple[list[RunReport], str]:
    """Every run under ``path``, and one line on Slurm's accounting ("" when it answered)."""
    found = [(folder, run_costs(folder)) for folder in run_dirs(path)]
    jobs = {cost.job for _, costs in found for cost in costs}
    slurm_runs, why_not = accounting.job_runs(jobs, run)
    made = [
        RunReport(folder, costs, [accounting.matching(c, slurm_runs) for c in costs])
        for folder, costs in found
    ]
    return made, why_not


def as_json(made: list[RunReport], why_not: str) -> str:
    """The runs, the totals over all of them, and why Slurm's figures are missing, if they are."""
    total = Totals.added([r.totals for r in made])
    document = {
        "runs": [r.as_dict() for r in made],
        "totals": total.as_dict(),
        "accounting": why_not or "sacct",
    }
    return json.dumps(document, indent=2)


_ATTEMPT = "{:>7}  {:<10} {:<26} {:>5} {:>4} {:>9} {:>6} {:>9} {:>9} {:>8} {:>8} {:>6}"
_HEAD = ("wall", "steps", "start-up", "lost", "node-h", "gpu-h", "useful")


def as_text(made: list[RunReport], why_not: str) -> str:
    """One table per run (a row per attempt), or for a sweep one row per run; totals last."""
    lines = _run_table(made[0], why_not == "") if len(made) == 1 else _sweep_table(made)
    if why_not:
        lines.append(f"Slurm accounting: {why_not}; the figures are what the runs recorded.")
    return "\n".join(lines)


def _run_table(made: RunReport, with_slurm: bool) -> list[str]:
    head = _ATTEMPT.format("attempt", "job", "ended", "nodes", "gpus", *_HEAD)
    lines = [str(made.run_dir), head + ("  slurm: state, elapsed, nodes" if with_slurm else "")]
    for cost, found in zip(made.costs, made.slurm, strict=True):
        wall = cost.wall_s if cost.started is not None else None
        row = _ATTEMPT.format(
            cost.attempt,
            cost.job or "local",
            _short(cost.cause),
            cost.nodes,
            cost.gpus,
            *_figures(cost, wall),
        )
        if with_slurm:
            slurm = f"{found.state}, {_clock(found.elapsed_s)}, {found.nodes}" if found else "-"
            row += f"  {slurm}"
        lines.append(row)
    lines.append(_totals_row("total", "", made.totals))
    return lines


def _sweep_table(made: list[RunReport]) -> list[str]:
    """A row per run (its name under the sweep), then the sweep's totals."""
    lines = [_ATTEMPT.format("run", "", "attempts", "", "", *_HEAD)]
    for number, r in enumerate(made):
        lines.append(_totals_row(str(number), r.run_dir.name, r.totals))
    lines.append(_totals_row("all", "", Totals.added([r.totals for r in made])))
    return lines


def _totals_row(label: str, name: str, t: Totals) -> str:
    attempts_ = f"{t.attempts} attempt(s)"
    row = _ATTEMPT.format(label, "", attempts_, "", "", *_figures(t, t.wall_s))
    return row + (f"  {name}" if name else "")


def _figures(row: AttemptCost | Totals, wall: float | None) -> tuple[str, ...]:
    """The columns after the first five: ``wall`` is the row's own (unknown, or a total)."""
    return (
        _clock(wall),
        str(row.steps_gained),
        _clock(row.startup_s),
        _clock(row.lost_s),
        f"{row.node_hours:.4f}",
        f"{row.gpu_hours:.4f}",
        f"{row.useful_share:.0%}",
    )


def _short(text: str, width: int = 26) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _clock(seconds: float | None) -> str:
    """``1:02:03``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
