"""What a GPU user has left when NCCL kills a rank: the flight recorder's settings (exported
with the process group's environment, a user's own winning), and the launcher's one line for a
rank that a signal ended."""

import dataclasses
import os
import pathlib
import signal

from hpcddp.comm import group
from hpcddp.comm.flight_recorder import flight_recorder_env
from hpcddp.launch import deaths, error_reports, local
from hpcddp.launch.resolve import resolve_env

LOGS = pathlib.Path("/runs/a/logs")


def test_the_flight_recorder_is_on_for_nccl_with_its_dumps_in_the_run_logs():
    assert flight_recorder_env("nccl", LOGS, {}) == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": "/runs/a/logs/nccl-trace-rank-",
    }
    assert flight_recorder_env("gloo", LOGS, {}) == {}  # gloo has no flight recorder
    assert flight_recorder_env("nccl", None, {}) == {}  # no run directory (hpcddp check)


def test_a_user_s_own_setting_wins_under_any_of_its_names():
    mine = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/x-"}
    assert flight_recorder_env("nccl", LOGS, mine) == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


def test_export_env_writes_them_and_restore_env_takes_them_back(monkeypatch):
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE"):
        monkeypatch.delenv(name, raising=False)
    env = dataclasses.replace(resolve_env({}), backend="nccl")
    previous = group.export_env(env, None, LOGS)
    assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == "/runs/a/logs/nccl-trace-rank-"
    assert os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    group.restore_env(previous)
    assert "TORCH_FR_DUMP_TEMP_FILE" not in os.environ


def test_a_rank_killed_by_sigabrt_is_named_with_its_status_not_a_survivor_s(capsys):
    lost = error_reports.Report(0, "n1", 1, "rank 0 on n1 lost contact with another rank", True)
    assert local._outcome((1, -signal.SIGABRT), [lost]) == 134
    printed = capsys.readouterr().err
    assert printed.startswith("hpcddp: error: local rank 1 was killed by SIGABRT (an NCCL abort")
    assert "RUN_DIR/logs/rank-1.log" in printed and "lost contact" not in printed
    own = error_reports.Report(0, "n1", 2, "your config is wrong", False)
    assert local._outcome((1, -signal.SIGABRT), [own]) == 2  # a cause a rank reported first
    assert local._outcome((1, 3), []) == 3 and local._outcome((1, -signal.SIGKILL), []) == 137
    assert deaths.signal_of(-6) is signal.SIGABRT and deaths.signal_of(134) is None


def test_fatal_stacks_go_to_the_rank_log_while_it_is_open_and_then_back(tmp_path):
    import subprocess
    import sys

    from tests.fixtures.helpers import REPO

    aborts = """
import os, pathlib, sys
from hpcddp.launch.resolve import resolve_env
from hpcddp.train.logs import setup_logging, teardown_logging
env = resolve_env({})
setup_logging(env, pathlib.Path(sys.argv[1]))
teardown_logging()
assert not __import__("faulthandler").is_enabled()  # as it was before
setup_logging(env, pathlib.Path(sys.argv[1]))
os.abort()
"""
    done = subprocess.run(
        [sys.executable, "-c", aborts, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGABRT, done.stderr
    log = (tmp_path / "rank-0.log").read_text()
    assert "Fatal Python error: Aborted" in log and 'File "<string>", line 10' in log
