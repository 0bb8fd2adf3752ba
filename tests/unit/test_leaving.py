"""``python -m hpcddp`` leaves a success or a Ctrl-C without the interpreter's teardown, losing
nothing.

Collecting every module at exit costs a rank about 0.7 CPU-s once torch and dynamo are loaded
(`hpcddp/__main__.py`). What an exit promises must still hold: the exit status, other threads
joined, every exit handler run, everything printed. A failure keeps the ordinary exit (a rank
that lost a peer must not be reported by srun before the rank that died).
"""

import subprocess
import sys

from tests.fixtures.helpers import REPO

# Runs ``python -m hpcddp`` as the job script does, after planting what an ordinary exit
# would show: an object torn down with its module, a thread still working, an exit handler.
PLANTED = """
import atexit, runpy, sys, threading, time

class TornDown:
    def __del__(self):
        print("torn down", flush=True)

sys.modules["planted"] = type(sys)("planted")
sys.modules["planted"].keep = TornDown()

def late_worker():
    time.sleep(0.3)
    print("thread finished", flush=True)

threading.Thread(target=late_worker).start()
interrupted = sys.argv[1:2] == ["--interrupted"]
sys.argv = ["hpcddp", *sys.argv[1 + interrupted:]]
import hpcddp.cli
import hpcddp.cli.train

def ctrl_c(args):
    raise KeyboardInterrupt

if interrupted:  # the command is stopped by a (second) Ctrl-C
    hpcddp.cli.train.cmd_env = ctrl_c
command = hpcddp.cli.main

def main():  # registers an exit handler while it runs, as logging and trackers do
    atexit.register(lambda: print("exit handler ran"))  # unflushed: the leaving flushes it
    return command()

hpcddp.cli.main = main
runpy.run_module("hpcddp", run_name="__main__")
"""


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PLANTED, *argv],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_command_that_returns_leaves_without_teardown_and_loses_nothing():
    done = run("env")
    assert done.returncode == 0, done.stderr
    assert "hpcddp env:" in done.stdout
    assert "thread finished" in done.stdout  # other threads are joined first
    assert "exit handler ran" in done.stdout  # exit handlers ran, their output flushed
    assert "torn down" not in done.stdout  # the interpreter's teardown was skipped


def test_a_ctrl_c_leaves_with_130_without_teardown_and_loses_nothing():
    """A second Ctrl-C ends each rank with KeyboardInterrupt; torn down as the others leave,
    a rank's native threads could abort it (SIGABRT, 134: read as a crash)."""
    done = run("--interrupted", "env")
    assert done.returncode == 130, done.stderr
    assert "hpcddp: interrupted" in done.stderr
    assert "thread finished" in done.stdout
    assert "exit handler ran" in done.stdout
    assert "torn down" not in done.stdout


def test_a_failure_keeps_its_status_and_the_ordinary_exit():
    done = run("train", "examples/quickstart.yaml", "--nproc", "0")
    assert done.returncode == 2
    assert "--nproc must be >= 1" in done.stderr
    assert "exit handler ran" in done.stdout
    assert "torn down" in done.stdout


def test_an_exit_main_did_not_return_keeps_the_ordinary_teardown():
    done = run("status")  # argparse's own exit (2): main never returns
    assert done.returncode == 2
    assert "torn down" in done.stdout
