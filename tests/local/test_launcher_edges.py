"""The local launcher's edges, with real processes: its death takes the ranks along; a shell's
left-over launch variables are refused at once instead of a 300 s wait."""

import json
import signal
import subprocess
import time

import psutil

from hpcddp import exit_codes
from tests.fixtures.helpers import (
    QUICK,
    QUICKSTART,
    TINY,
    local_ranks,
    run_cli,
    start_local,
    wait_for_step,
)

LONG = [*QUICK, "train.epochs=200", "train.log_every_steps=1"]


def test_kill_9_of_the_launcher_leaves_no_rank_alive(tmp_path):
    run_dir = tmp_path / "run"
    launcher = start_local(
        run_dir, *LONG, start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_step(run_dir, 3)
        ranks = local_ranks(launcher.pid)
        assert len(ranks) == 2
        ranks += psutil.Process(launcher.pid).children()  # and their zygote
        launcher.kill()  # SIGKILL: no handler, no forwarding; only the kernel can tell them
        since = time.monotonic()
        _gone, alive = psutil.wait_procs(ranks, timeout=10)
        took = time.monotonic() - since
        # an exited rank whose new parent has not reaped it yet is a zombie: gone all the same
        alive = [p for p in alive if _running(p)]
    finally:
        launcher.kill()
        launcher.wait()
    assert not alive, f"ranks or zygote {[p.pid for p in alive]} outlived the launcher by 10 s"
    print(f"both ranks gone {took:.1f} s after kill -9 of their launcher")
    # they heard SIGTERM from the kernel and stopped cleanly: rank 0 recorded why
    (record,) = [json.loads(x) for x in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert record["cause"] == "terminated" and record["step"] >= 3


def test_a_killed_zygote_ends_the_launch_with_its_ranks_and_says_so(tmp_path):
    """The ranks' parent, killed (the out-of-memory killer's pick, say): the launcher is not left
    waiting for statuses nobody will tell, and no rank is left running."""
    run_dir = tmp_path / "run"
    launcher = start_local(
        run_dir, *LONG, start_new_session=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_step(run_dir, 3)
        ranks = local_ranks(launcher.pid)
        (zygote,) = psutil.Process(launcher.pid).children()
        zygote.kill()
        _out, err = launcher.communicate(timeout=30)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signal.SIGKILL, err[-3000:]
    assert f"the ranks' zygote (pid {zygote.pid}) ended with status -9" in err, err[-3000:]
    _gone, alive = psutil.wait_procs(ranks, timeout=10)
    assert not [p for p in alive if _running(p)]


def test_leftover_local_variables_are_refused_in_one_line_at_once(tmp_path):
    leftovers = {"HPCDDP_LOCAL_RANK": "1", "HPCDDP_LOCAL_WORLD_SIZE": "2"}
    leftovers["HPCDDP_LOCAL_JOB_ID"] = "1"  # init: an ancestor of all, but never our launcher
    since = time.monotonic()
    done = run_cli("train", QUICKSTART, f"run.dir={tmp_path}/run", *TINY, env=leftovers, timeout=60)
    assert time.monotonic() - since < 60  # not dist.timeout_s waiting for a rank 0
    assert done.returncode == exit_codes.USAGE
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("hpcddp: error: single: HPCDDP_LOCAL_JOB_ID=1 HPCDDP_LOCAL_RANK=1")
    assert "its launcher, pid 1, did not start this process" in line


def test_half_a_torchrun_environment_is_refused_in_one_line(tmp_path):
    done = run_cli("train", QUICKSTART, f"run.dir={tmp_path}/run", *TINY, env={"LOCAL_RANK": "1"})
    assert done.returncode == exit_codes.USAGE
    (line,) = done.stderr.strip().splitlines()
    assert "LOCAL_RANK=1 is set, but not the rest of a launcher's variables" in line


def test_check_runs_like_training_with_nproc(tmp_path):
    done = run_cli("check", QUICKSTART, f"run.dir={tmp_path}/run", "--nproc", "2", "--size-mb", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("hpcddp check: 2 rank(s) on 1 node(s), launcher local")
    host = lines[3].split()[1]
    assert [line.split()[:2] for line in lines[3:5]] == [["0", host], ["1", host]]
    assert "lo 127.0.0.1" in lines[3] and "all-reduce (gloo, 2 ranks)" in done.stdout
    assert lines[-1] == "no problems found: the job should train."
    assert not (tmp_path / "run").exists()  # the check leaves nothing behind
    # the quickstart MLP counted on the meta device: three Linear layers, weights and biases
    params = (16 * 256 + 256) + (256 * 256 + 256) + (256 * 4 + 4)
    assert f"model state per rank ({params:,} parameters;" in done.stdout
    assert "RAM per rank; dist.strategy=ddp fits" in done.stdout


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
