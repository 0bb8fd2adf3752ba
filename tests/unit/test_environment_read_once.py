"""The rank side reads the launch environment from the resolved `DistEnv` (its ``environ``),
never from ``os.environ`` behind its back: a test, a wrapper or a library that changes the
process environment after start-up cannot change what a run records."""

import json

import torch

from hpcddp.config import Config
from hpcddp.launch.resolve import resolve_env
from hpcddp.train.metrics_writer import MetricsWriter


def test_the_resumed_line_records_the_restart_count_of_the_resolved_environment(
    tmp_path, monkeypatch
):
    env = resolve_env({"SLURM_RESTART_COUNT": "2"}, cuda_devices=lambda: 0)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "7")  # the process environment says otherwise
    reports = MetricsWriter(Config(), env, torch.device("cpu"), [env.hostname])
    reports.open(tmp_path, step=10)
    reports.close()
    (line,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert line["event"] == "resumed" and line["slurm_restart_count"] == "2"
