"""The run directory: which config changes a resume accepts; a metrics log that survives a crash."""

import json
import logging

import pytest

from hpcddp.config import load_config
from hpcddp.errors import ConfigError
from hpcddp.storage.metrics import MetricsLog
from hpcddp.storage.rundir import config_differences, prepare
from tests.helpers import QUICKSTART


def test_metrics_log_skips_a_line_cut_short(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'
        '{"step": 5, "loss": 1.0}\n{"step": 6, "lo'
    )  # killed mid-write
    with caplog.at_level(logging.WARNING, logger="hpcddp.storage.metrics"):
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
