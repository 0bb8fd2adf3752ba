"""The run directory's one module (`hpcddp.run_files`): summary.json read and written in one
typed shape, old files still read, and no other module spelling a run's file names.

``tests/fixtures/summary_finished.json`` is a summary.json exactly as hpcddp wrote it before
this module existed (a 2-rank quickstart run on this machine, byte for byte).
"""

import ast
import json
import math
import os
import pathlib
import time

import pytest

from hpcddp import run_files
from hpcddp.records.runinfo import run_lines
from hpcddp.run_files import DamagedSummary, RunSummary, read_summary
from hpcddp.slurm import run_end
from tests.fixtures.helpers import REPO

WRITTEN_BEFORE = REPO / "tests" / "fixtures" / "summary_finished.json"


def test_a_summary_written_before_reads_typed_and_is_written_back_byte_for_byte(tmp_path):
    old = WRITTEN_BEFORE.read_text()
    (tmp_path / "summary.json").write_text(old)
    summary = read_summary(tmp_path)
    assert summary is not None and not summary.failed
    assert (summary.status, summary.steps, summary.world_size) == ("finished", 16, 2)
    assert summary.hosts == ["vm", "vm"] and summary.final_loss == pytest.approx(0.7583, abs=1e-4)
    assert summary.evaluation == {"eval_loss": 0.7407943606376648, "eval_accuracy": 0.7734375}
    assert summary.attempts is not None and summary.attempts[0]["cause"] == "finished"
    assert summary.to_json() == old  # users' scripts read the same file as before


def test_a_failed_run_s_summary_is_failed_with_its_reason_everywhere_it_is_read(tmp_path):
    failed = json.loads(WRITTEN_BEFORE.read_text())
    failed.update(status="failed", reason="nonfinite", steps=8, first_rank=1, message="nan")
    (tmp_path / "summary.json").write_text(json.dumps(failed, indent=2) + "\n")
    (tmp_path / "config.yaml").write_text("run: {}\n")
    summary = read_summary(tmp_path)
    assert summary is not None and summary.failed and summary.first_rank == 1
    assert run_end.read(tmp_path, since=time.time() - 10) == run_end.RunEnd(True, "nonfinite")
    lines = run_lines(tmp_path)
    assert any(line.endswith("no: failed at step 8 (nonfinite)") for line in lines)


def test_an_older_summary_missing_fields_still_reads_as_the_finished_run_it_was(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 5, "eval_loss": 0.5}))
    summary = read_summary(tmp_path)
    assert summary is not None and not summary.failed
    assert (summary.steps, summary.evaluation, summary.hosts) == (5, {"eval_loss": 0.5}, [])
    assert math.isnan(summary.final_loss)  # unknown, not a made-up loss
    assert run_end.read(tmp_path, since=time.time() - 10) == run_end.RunEnd()


@pytest.mark.parametrize(
    ("text", "why"), [('{"status": "fini', "not JSON"), ("[1, 2]", "not a JSON object")]
)
def test_a_damaged_summary_raises_one_error_saying_what_is_wrong(tmp_path, text, why):
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(DamagedSummary, match=why):
        read_summary(tmp_path)


def test_no_summary_or_one_older_than_the_job_is_none(tmp_path):
    assert read_summary(tmp_path) is None
    path = tmp_path / "summary.json"
    path.write_text(RunSummary("finished", 1, ["h"], "local", "", 3, 1, 0.5, 0, 0).to_json())
    hour_ago = time.time() - 3600
    os.utime(path, (hour_ago, hour_ago))
    assert read_summary(tmp_path, since=time.time() - 60) is None  # an earlier run's
    summary = read_summary(tmp_path, since=hour_ago - 60)
    assert summary is not None and summary.steps == 3


# The names of files a run writes: only hpcddp/run_files.py spells them.
RUN_FILE_NAMES = {
    value
    for name, value in vars(run_files).items()
    if name.isupper() and isinstance(value, str) and "." in value
}


def _spelled(path: pathlib.Path) -> list[str]:
    """String constants in ``path`` that are a run file's name (docstrings aside)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and node.value in RUN_FILE_NAMES
        and id(node) not in docstrings
    ]


def test_only_the_run_files_module_spells_the_names_of_a_run_s_files():
    assert {"summary.json", "metrics.jsonl", "config.yaml", "attempts.jsonl"} <= RUN_FILE_NAMES
    found = [
        hit
        for path in sorted((REPO / "hpcddp").rglob("*.py"))
        if path.name != "run_files.py"
        for hit in _spelled(path)
    ]
    assert found == [], "use the names in hpcddp/run_files.py"
