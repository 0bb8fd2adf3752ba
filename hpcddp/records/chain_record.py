"""``RUN_DIR/chain.json``: the jobs of a run submitted as a chain (``slurm.chain=N``).

Written on the login node when the chain is submitted: first the chain's name and time, before
any link can start, then each link's job id as sbatch returns it. The links read it to learn
that they are links (a link stopped by its time limit hands on to the next instead of
requeueing), the job script's helper to find the links left to cancel, and ``hpcddp status``
to show the chain. One chain per run directory: a new submission replaces the record.

Torch-free, so the job script's helper and the login node can read it.
"""

import dataclasses
import json
import os
import pathlib
from typing import Any

from hpcddp import run_files
from hpcddp.storage.atomic import atomic_write_text

FILE = run_files.CHAIN


@dataclasses.dataclass(frozen=True)
class ChainRecord:
    """One chain: its Slurm job name, how many links it was asked for and their job ids."""

    name: str  # every link's job name: --dependency=singleton orders jobs of one name
    size: int  # slurm.chain
    submitted_at: float  # epoch seconds; a summary.json older than this is an earlier run's
    links: tuple[str, ...] = ()  # job ids, in submission (and so running) order

    def position(self, job_id: str) -> int | None:
        """This job's link number (1 for the first), or None when it is no link of the chain."""
        return self.links.index(job_id) + 1 if job_id and job_id in self.links else None

    def follow(self, run_dir: str | os.PathLike[str]) -> str:
        """How to follow the chain and cancel all its links, as the submitting commands say it."""
        status = f"`hpcddp status {run_dir}`"
        return f"follow it with {status}, cancel it with `scancel --name={self.name}`"

    def after(self, job_id: str) -> tuple[str, ...]:
        """The links submitted after this one (what is left when it ends the run)."""
        where = self.position(job_id)
        return () if where is None else self.links[where:]


def save(run_dir: str | os.PathLike[str], record: ChainRecord) -> pathlib.Path:
    """Write the record whole (a reader never sees half of it)."""
    path = pathlib.Path(run_dir) / FILE
    atomic_write_text(path, json.dumps(dataclasses.asdict(record), indent=2) + "\n")
    return path


def load(run_dir: str | os.PathLike[str]) -> ChainRecord | None:
    """The run's chain, or None when it was not submitted as one (or the record is unreadable)."""
    try:
        data: Any = json.loads((pathlib.Path(run_dir) / FILE).read_text())
        return ChainRecord(
            name=str(data["name"]),
            size=int(data["size"]),
            submitted_at=float(data["submitted_at"]),
            links=tuple(str(job) for job in data["links"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def link_of(run_dir: str | os.PathLike[str], job_id: str) -> tuple[ChainRecord, int] | None:
    """The chain and this job's place in it, or None when the job is no link of a chain."""
    record = load(run_dir)
    where = record.position(job_id) if record else None
    return (record, where) if record is not None and where is not None else None
