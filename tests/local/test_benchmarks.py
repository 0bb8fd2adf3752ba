"""The benchmarks run end to end and print their tables (figures are not checked).

Opt-in (``python -m pytest -m benchmark``): they check only the output's format.
"""

import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.benchmark]


def run(module: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", f"tests.benchmarks.{module}", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result.stdout


def test_checkpoint_benchmark_quick_prints_every_ratio(tmp_path):
    out = run("checkpoints", "--quick", "--dir", str(tmp_path))
    for row in ("stall per save", "write MB/s", "write MB/s while training", "load s"):
        assert re.search(rf"^{row}.*\s\d+\.\d\d\s+[<>]= \d\.\d\d$", out, re.M), out
    assert re.search(r"^  delete a checkpoint, s \(keep_checkpoints\)\s+\d+\.\d\d$", out, re.M), out
    assert re.search(r"^peak RSS on resume.*\s\d\.\d\d\s+\d\.\d\d\s+<= 1\.10$", out, re.M), out
    assert re.search(r"^pinned bytes / state.*\s1\.0\d\s+\d\.\d\d\s+<= 1\.10$", out, re.M), out
    assert re.search(r"^digest GB/s \(xxh3-128 vs sha256 chunks\)(\s+\d+\.\d\d){3}$", out, re.M), (
        out
    )
    assert list(tmp_path.iterdir()) == []


def test_format_benchmark_compares_every_writer(tmp_path):
    out = run("formats", "--size-mb", "64", "--runs", "1", "--dir", str(tmp_path))
    assert len(re.findall(r"\d+ MB/s\s+\d\.\d\dx$", out, re.M)) == 5, out


def test_telemetry_benchmark_quick_prints_the_cost_per_step():
    out = run("telemetry", "--quick")
    assert re.search(r"^plain step\s+\d+\.\d{4} ms$", out, re.M), out
    assert re.search(r"^difference\s+-?\d+\.\d{4} ms", out, re.M), out
    assert re.search(r"^cost\s+\d+\.\d{4} ms  target <= 0\.05 ", out, re.M), out


def test_watchdog_benchmark_quick_prints_both_arms_and_the_difference():
    out = run("watchdog", "--quick")
    for row in ("plain step", "with watchdog"):
        assert re.search(rf"^{row}\s+\d+\.\d{{4}} ms", out, re.M), out
    assert re.search(r"^difference\s+[-+]\d+\.\d{4} ms  ratio \d\.\d{3}$", out, re.M), out


def test_startup_cpu_benchmark_prints_both_arms_and_the_ratio():
    out = run("startup_cpu", "--rounds", "1")
    for row in ("to the first step:", "whole process:"):
        assert re.search(
            rf"^{row}\s+raw \d+\.\d\d  hpcddp \d+\.\d\d  ratio \d\.\d{{3}} \(target <= 1\.10\)$",
            out,
            re.M,
        ), out


def test_local_launch_benchmark_prints_both_arms_and_the_ratio():
    out = run("local_launch", "--quick")
    assert re.search(r"^\s+2 exec'd\s+\d+\.\d\d\s+\d+\.\d\d\s+1\.00$", out, re.M), out
    assert re.search(r"^\s+2 forked\s+\d+\.\d\d\s+\d+\.\d\d\s+\d\.\d\d$", out, re.M), out


def test_survivor_handoff_benchmark_loses_no_step_and_ends_with_the_same_weights():
    out = run("survivor_handoff", "--hidden", "64", "--steps", "24", "--every", "5",
              "--die-at", "12", "--runs", "1")  # fmt: skip
    # died at step 12: the checkpoint of step 10 loses 2 steps, the survivor's state none
    assert re.search(r"^checkpoint(\s+\d+\.\d\d){2}\s+2\s+\d+\.\d\d  yes$", out, re.M), out
    assert re.search(r"^hand-off(\s+\d+\.\d\d){2}\s+0\s+\d+\.\d\d  yes$", out, re.M), out


def test_sharded_load_benchmark_quick_prints_both_ratios():
    out = run("sharded_loads", "--quick")
    number = r"\s+\d+\.\d{3}\s+\d+\.\d\d"  # seconds, then the ratio
    assert re.search(r"^raw\s+\d+\.\d{3}\s+\d+\.\d{3}\s*$", out, re.M), out
    assert re.search(rf"^same-size load{number}{number}  wall <= 1\.25x raw$", out, re.M), out
    assert re.search(
        rf"^resharded load{number}{number}  wall <= 1\.50x same-size load$", out, re.M
    ), out
