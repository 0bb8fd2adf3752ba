"""The run directory: which config changes a resume accepts, runs never mixed, the code that ran;
a metrics log that survives a crash."""

import copy
import json
import logging

import pytest

from hpcddp.config import load_config
from hpcddp.errors import ConfigError
from hpcddp.records import provenance
from hpcddp.records.metrics_log import MetricsLog
from hpcddp.records.rundir import Attempt, config_differences, prepare, record_code
from tests.fixtures.helpers import QUICKSTART


def test_metrics_log_skips_a_line_cut_short(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'
        '{"step": 5, "loss": 1.0}\n{"step": 6, "lo'
    )  # killed mid-write
    with caplog.at_level(logging.WARNING, logger="hpcddp.records.metrics_log"):
        log = MetricsLog(path, resume_step=5)
    log.write(step=6, loss=0.9)
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r.get("event")) for r in records] == [
        (1, None), (2, None), (5, None), (5, "resumed"), (6, None)
    ]  # fmt: skip
    assert f"{path} line 4" in caplog.text
    MetricsLog(path, resume_step=6).close()  # and the next resume reads it again


def test_metrics_log_drops_lines_past_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3, 4)))
    MetricsLog(path, resume_step=2).close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records if "event" not in r] == [1, 2]
    assert records[-1]["event"] == "resumed" and records[-1]["step"] == 2


def test_another_spelling_of_the_run_dir_resumes(tmp_path):
    prepare(load_config(QUICKSTART, [f"run.dir={tmp_path}/run", "run.name=a"]))
    prepare(load_config(QUICKSTART, [f"run.dir={tmp_path}/./run/", "run.name=b"]))  # no error


@pytest.mark.parametrize(
    "key, old, new",
    [
        ("run.dir", "/a/run", "/b/../a/run"),
        ("run.name", "x", "y"),
        ("train.log_every_steps", 5, 10),
        ("dist.timeout_s", 60.0, 600.0),
    ],
)
def test_resumable_changes(key, old, new):
    section, name = key.split(".")
    assert config_differences({section: {name: old}}, {section: {name: new}}) == []


def test_worker_count_is_not_a_resumable_change(tmp_path):
    assert config_differences({"data": {"num_workers": 0}}, {"data": {"num_workers": 4}}) == [
        "data.num_workers: 0 -> 4"
    ]
    prepare(load_config(QUICKSTART, [f"run.dir={tmp_path}", "data.num_workers=0"]))
    with pytest.raises(ConfigError, match="data.num_workers: 0 -> 2"):
        prepare(load_config(QUICKSTART, [f"run.dir={tmp_path}", "data.num_workers=2"]))


# -- run.resume=false never mixes two runs -------------------------------------------------------


def started(config, attempt=None):
    """What a run does to its directory before it trains: prepare it, then record its code."""
    root = prepare(config, attempt)
    record_code(config, root, attempt or Attempt())
    return root


def old_run(tmp_path, job=""):
    """A run directory as an earlier run left it: config, code, checkpoints up to step 900."""
    run = tmp_path / "run"
    started(load_config(QUICKSTART, [f"run.dir={run}"]), Attempt(job=job))
    for step in (800, 900):
        (run / "checkpoints" / f"step-{step:08d}.pt").write_text("old")
    return run


def test_resume_false_on_an_existing_run_is_refused(tmp_path):
    run = old_run(tmp_path)
    with pytest.raises(ConfigError, match=r"run.resume=false but .* already holds a run.*HINT"):
        prepare(load_config(QUICKSTART, [f"run.dir={run}", "run.resume=false"]))
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[-1] == "step-00000900.pt"


def test_overwrite_moves_the_old_run_aside_whole(tmp_path, caplog):
    run = old_run(tmp_path)
    config = load_config(QUICKSTART, [f"run.dir={run}", "run.resume=false", "run.overwrite=true"])
    with caplog.at_level(logging.WARNING, logger="hpcddp.records.rundir"):
        prepare(config)
    (aside,) = tmp_path.glob("run.old-*")
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == [
        "step-00000800.pt",
        "step-00000900.pt",
    ]
    assert list((run / "checkpoints").iterdir()) == []  # nothing of the old run to prune or load
    assert "moved the previous run" in caplog.text


def test_a_requeued_attempt_of_the_same_job_continues_with_resume_false(tmp_path):
    run = old_run(tmp_path, job="4242")
    config = load_config(QUICKSTART, [f"run.dir={run}", "run.resume=false"])
    prepare(config, Attempt(job="4242", restart=1))  # its own first attempt wrote it
    assert (run / "checkpoints" / "step-00000900.pt").exists()
    with pytest.raises(ConfigError, match="already holds a run"):
        prepare(config, Attempt(job="4243"))  # another job's run


def test_other_code_warns_in_one_line_or_is_refused(tmp_path, monkeypatch, caplog):
    run = old_run(tmp_path)
    real = provenance.collect()
    changed = {**real, "versions": {**real["versions"], "torch": "0.0.1"}}
    monkeypatch.setattr(provenance, "collect", lambda factories=(): copy.deepcopy(changed))
    with caplog.at_level(logging.WARNING, logger="hpcddp.records.rundir"):
        started(load_config(QUICKSTART, [f"run.dir={run}"]))
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        f"resuming {run} with other code: torch {real['versions']['torch']} -> 0.0.1"
    )
    assert (run / "provenance-1.json").exists()  # what the first attempt ran, kept
    monkeypatch.setattr(provenance, "collect", lambda factories=(): copy.deepcopy(real))
    with pytest.raises(ConfigError, match=r"was run with other code \(torch 0.0.1 -> .*same_code"):
        started(load_config(QUICKSTART, [f"run.dir={run}", "run.same_code=true"]))
