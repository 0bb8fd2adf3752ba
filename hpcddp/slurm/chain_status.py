"""The chain of a run, for ``hpcddp status RUN_DIR``: one row per link.

Each link's job id comes from ``RUN_DIR/chain.json`` (`hpcddp.records.chain_record`), its
state from one ``squeue`` call (`hpcddp.slurm.queue`), and the steps it gained and how it
ended from the attempts rank 0 and the job script recorded (`hpcddp.records.attempts`), which
outlive Slurm's memory of the job.
"""

import dataclasses
import os
from typing import Any

from hpcddp.records import attempts, chain_record
from hpcddp.slurm.queue import LEFT_QUEUE, Runner, query_states

# How a link's last attempt ended, in words.
_ENDINGS = {
    "preempted": "handed on at its time limit",
    "finished": "completed the run",
    "terminated": "terminated",
    "nonfinite": "failed: non-finite loss",
}


@dataclasses.dataclass(frozen=True)
class LinkRow:
    """One link: its place, job id, state, and the steps its attempts spanned."""

    link: int
    job_id: str
    state: str
    from_step: int | None = None  # None: it never trained (pending, cancelled, left at once)
    step: int | None = None
    ending: str = ""

    def line(self) -> str:
        """``link 2:  job 12  COMPLETED  steps 55 -> 64 (+9), completed the run``."""
        text = f"job {self.job_id:<8} {self.state:<11}"
        if self.from_step is not None and self.step is not None:
            gained = self.step - self.from_step
            text += f" steps {self.from_step} -> {self.step} (+{gained})"
        text += f", {self.ending}" if self.ending else ""
        return f"{f'link {self.link}:':<18}{text.rstrip()}"


def link_rows(
    record: chain_record.ChainRecord,
    history: list[dict[str, Any]],
    states: dict[str, dict[str, str]],
) -> list[LinkRow]:
    """The rows of a chain, from its record, the run's attempts and Slurm's states."""
    rows = []
    for number, job_id in enumerate(record.links, start=1):
        mine = [a for a in history if a.get("job") == job_id]
        state = states.get(job_id, {}).get("State", "unknown")  # squeue did not answer
        if state == LEFT_QUEUE:  # Slurm forgot it: it ended a while ago
            state = "ended" if mine else "left the queue"
        last = str(mine[-1].get("cause", "")) if mine else ""
        if last == "preempted" and number == len(record.links):
            last = "stopped at its time limit, the chain spent: submit again to resume"
        rows.append(
            LinkRow(
                link=number,
                job_id=job_id,
                state=state,
                from_step=int(mine[0].get("from_step", 0)) if mine else None,
                step=int(mine[-1].get("step", 0)) if mine else None,
                ending=_ENDINGS.get(last, last),
            )
        )
    return rows


def chain_lines(run_dir: str | os.PathLike[str], run: Runner | None = None) -> list[str]:
    """``hpcddp status`` lines for the run's chain; [] when it was not submitted as one."""
    record = chain_record.load(run_dir)
    if record is None:
        return []
    states = query_states(record.links, run)
    rows = link_rows(record, attempts.records(run_dir), states)
    head = f"{record.name}, {record.size} links (cancel all: scancel --name={record.name})"
    return [f"{'chain:':<18}{head}", *(row.line() for row in rows)]
