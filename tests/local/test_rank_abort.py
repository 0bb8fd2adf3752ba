"""A rank aborted inside a collective, as NCCL's watchdog aborts one (issue 15 item 4), emulated
on gloo: rank 1 calls ``os.abort()`` in its backward while rank 0 waits in the all-reduce."""

import time

from tests.fixtures.helpers import QUICKSTART, TINY, line_of, run_cli


def test_an_aborted_rank_is_named_its_stack_logged_and_it_is_a_rank_death(tmp_path):
    run = tmp_path / "run"
    started = time.monotonic()
    done = run_cli(
        "train",
        QUICKSTART,
        f"run.dir={run}",
        *TINY,
        "model.factory=tests.fixtures.faulty_model:make_model",
        "model.kwargs={rank: 1, at_call: 1, mode: abort}",
        "--nproc",
        "2",
        timeout=120,
    )
    assert time.monotonic() - started < 60  # the survivor was stopped, not left to time out
    assert done.returncode == 134, done.stderr[-3000:]  # 128 + SIGABRT: a death, not bad input
    errors = [line for line in done.stderr.splitlines() if line.startswith("hpcddp: error:")]
    assert len(errors) == 1 and "local rank 1 was killed by SIGABRT" in errors[0], done.stderr
    log = (run / "logs" / "rank-1.log").read_text()
    assert "Fatal Python error: Aborted" in log  # faulthandler wrote into the rank's own log
    abort_line = line_of("tests/fixtures/faulty_model.py", "os.abort()").split(":")[-1]
    assert f'faulty_model.py", line {abort_line} in <lambda>' in log, log[-3000:]
    assert "Fatal Python error" not in (run / "logs" / "rank-0.log").read_text()
