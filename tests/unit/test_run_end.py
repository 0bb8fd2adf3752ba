"""summary.json's verdict, read once for `hpcddp status` and for chained links: never a
previous run's file, a failure with its reason, a damaged file said as such."""

import json
import os
import time

from hpcddp.slurm import chain, run_end, status
from hpcddp.slurm.index import JobRecord


def write(run_dir, text: str, age_s: float = 0.0) -> None:
    path = run_dir / "summary.json"
    path.write_text(text)
    then = time.time() - age_s
    os.utime(path, (then, then))


def test_a_fresh_summary_says_completed_or_failed_with_its_reason(tmp_path):
    since = time.time() - 10
    assert run_end.read(tmp_path, since) is None  # nothing written yet
    write(tmp_path, json.dumps({"status": "completed", "final_loss": 0.1}))
    assert run_end.read(tmp_path, since) == run_end.RunEnd()
    write(tmp_path, json.dumps({"status": "failed", "reason": "non-finite loss at step 7"}))
    assert run_end.read(tmp_path, since) == run_end.RunEnd(True, "non-finite loss at step 7")
    assert chain.run_ended(tmp_path, since) == "failed (non-finite loss at step 7)"


def test_a_summary_older_than_the_job_is_a_previous_runs(tmp_path):
    write(tmp_path, json.dumps({"status": "completed"}), age_s=60)
    assert run_end.read(tmp_path, since=time.time() - 30) is None
    assert chain.run_ended(tmp_path, time.time() - 30) == ""


def test_a_damaged_summary_is_unknown_to_status_and_no_end_to_a_chain(tmp_path):
    write(tmp_path, '{"status": "comp')  # torn
    since = time.time() - 10
    assert run_end.read(tmp_path, since) == run_end.RunEnd(damaged=True)
    assert chain.run_ended(tmp_path, since) == ""  # the next link carries on and finds out
    record = JobRecord(
        job_id="1", cluster="slurm", run_dir=str(tmp_path), submitit_folder=str(tmp_path),
        stdout="", stderr="", num_tasks=1, submitted_at=since,
    )  # fmt: skip
    assert status.file_outcome(record) == "UNKNOWN (summary.json is damaged)"
