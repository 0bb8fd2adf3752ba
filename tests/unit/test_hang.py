"""The hang watchdog's rules with a fake clock, and its threads talking through a store.

`hpcddp.comm.hang` decides what a hang is and who caused it; `hpcddp.comm.watchdog` runs it in
a thread per rank. Here two watchdogs share one in-memory store, as two ranks share the job's
store, and each watches a thread standing in for its rank's main thread: one stuck in user
code, one waiting in what looks like a collective (a function whose file is under
torch/distributed/).
"""

import json
import sys
import threading
import time

import pytest
import torch.distributed as dist

from hpcddp import exit_codes
from hpcddp.comm import hang
from hpcddp.comm.stacks import dump_stacks
from hpcddp.comm.watchdog import VERDICT, Place, Watchdog
from hpcddp.config import load_config
from hpcddp.errors import ConfigError

BUDGET = hang.Budget(steady_s=20.0, slow_s=200.0)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- what a hang is -----------------------------------------------------------------------------


def test_a_step_that_stands_still_past_the_budget_is_a_stall():
    timer = hang.StallTimer(BUDGET, first_step=0, now=0.0)
    assert timer.stalled_s(1, hang.STEPS, now=5.0) is None  # the first step was done: progress
    assert timer.stalled_s(1, hang.STEPS, now=25.0) is None  # 20 s since: within the budget
    assert timer.stalled_s(1, hang.STEPS, now=25.5) == pytest.approx(20.5)


def test_every_step_restarts_the_count():
    timer = hang.StallTimer(BUDGET, first_step=0, now=0.0)
    for step in range(1, 10):  # 15 s a step: slow, never stalled
        assert timer.stalled_s(step, hang.STEPS, now=15.0 * step) is None
    assert timer.stalled_s(9, hang.STEPS, now=15.0 * 9 + 21) is not None


def test_the_first_step_and_slow_phases_get_the_long_budget():
    timer = hang.StallTimer(BUDGET, first_step=40, now=0.0)  # resumed at step 40
    assert timer.stalled_s(40, hang.STEPS, now=150.0) is None  # its first step: compiling, say
    assert timer.stalled_s(40, hang.STEPS, now=201.0) == pytest.approx(201.0)
    timer = hang.StallTimer(BUDGET, first_step=0, now=0.0)
    assert timer.stalled_s(3, "checkpoint", now=1.0) is None
    assert timer.stalled_s(3, "checkpoint", now=150.0) is None
    assert timer.stalled_s(3, hang.STEPS, now=160.0) is None  # the save ended: progress
    assert timer.stalled_s(3, hang.STEPS, now=181.0) is not None
    assert timer.stalled_s(3, "evaluation", now=182.0) is None  # an evaluation begun: progress
    assert timer.stalled_s(3, "evaluation", now=350.0) is None  # an evaluation is slow too
    assert timer.stalled_s(3, "evaluation", now=383.0) is not None


def test_the_slow_budget_defaults_to_ten_steady_ones():
    assert hang.Budget.from_config(20.0, 0.0) == hang.Budget(20.0, 200.0)
    assert hang.Budget.from_config(20.0, 90.0) == hang.Budget(20.0, 90.0)


# -- who caused it ------------------------------------------------------------------------------


def report(rank: int, step: int, waiting: bool) -> hang.Report:
    return hang.Report(rank=rank, host=f"n{rank // 2}", step=step, phase=hang.STEPS,
                       waiting=waiting)  # fmt: skip


def test_the_rank_outside_any_collective_is_the_one_behind():
    reports = {0: report(0, 12, True), 1: report(1, 12, False), 2: report(2, 12, True)}
    assert hang.behind(reports, 3) == [1]


def test_a_rank_at_an_earlier_step_is_behind_even_if_it_waits():
    reports = {0: report(0, 13, False), 1: report(1, 12, True), 2: report(2, 13, True)}
    assert hang.behind(reports, 3) == [1]


def test_a_rank_that_never_reports_is_behind():
    reports = {0: report(0, 12, True), 2: report(2, 12, True)}
    assert hang.behind(reports, 3) == [1]


def test_a_rank_that_finished_training_is_not_silent_but_ahead():
    """A hang in the last step: the others finished and wait in the closing collectives."""
    reports = {1: report(1, 95, False)}
    assert hang.behind(reports, 3, done=[0, 2]) == [1]
    assert hang.behind(reports, 3) == [0, 2]  # without knowing, they would look silent


def test_when_every_rank_waits_all_of_the_lowest_are_named():
    reports = {0: report(0, 12, True), 1: report(1, 12, True)}
    assert hang.behind(reports, 2) == [0, 1]


def frame_in(filename: str):
    """A real frame whose code lives in ``filename``, as a torch or user frame would."""
    namespace: dict = {}
    exec(compile("import sys\ndef here():\n    return sys._getframe()\n", filename, "exec"),
         namespace)  # fmt: skip
    return namespace["here"]()


def test_a_frame_in_torch_distributed_or_autograd_waits_for_others():
    assert hang.waiting_in_collective(frame_in("/x/torch/distributed/distributed_c10d.py"))
    assert hang.waiting_in_collective(frame_in("/x/torch/autograd/graph.py"))
    assert not hang.waiting_in_collective(frame_in("/home/me/model.py"))
    assert not hang.waiting_in_collective(frame_in("/x/torch/nn/parallel/distributed.py"))


def test_a_wait_inside_pythons_own_library_is_judged_by_its_caller():
    release = threading.Event()
    waiting, stuck = in_a_collective(release), stuck_in_user_code(release)
    waiting.start(), stuck.start()
    try:
        time.sleep(0.1)  # both now wait inside threading.py
        frames = sys._current_frames()
        assert hang.waiting_in_collective(frames[waiting.ident])
        assert hang.innermost(frames[waiting.ident]).endswith("in all_reduce")
        assert not hang.waiting_in_collective(frames[stuck.ident])
        assert hang.innermost(frames[stuck.ident]).endswith("in sleep_in_forward")
    finally:
        release.set()


def test_the_console_line_names_rank_host_step_frame_and_stacks():
    hung = [hang.Report(1, "c7n2", 12, hang.STEPS, False, "model.py:30 in forward")]
    line = hang.message(hung, [], 20.0, "/run/logs/hang/job-5.0")
    assert "rank 1 on c7n2 after step 12 (at model.py:30 in forward)" in line
    assert "no progress for 20 s" in line and "/run/logs/hang/job-5.0" in line
    assert "\n" not in line and "HINT:" in line


def test_the_config_refuses_a_hang_timeout_the_collectives_would_beat():
    assert load_config(None, ["dist.hang_timeout_s=20"]).dist.hang_timeout_s == 20
    with pytest.raises(ConfigError, match="not below dist.timeout_s=300"):
        load_config(None, ["dist.hang_timeout_s=300"])
    with pytest.raises(ConfigError, match="dist.hang_slow_phase_s=-1.0 is negative"):
        load_config(None, ["dist.hang_slow_phase_s=-1"])


# -- two watchdogs, one store ---------------------------------------------------------------


def in_a_collective(release: threading.Event) -> threading.Thread:
    """A thread whose innermost frame is in a file under torch/distributed/, waiting."""
    namespace: dict = {}
    source = "def all_reduce(release):\n    release.wait()\n"
    exec(compile(source, "/site/torch/distributed/fake_c10d.py", "exec"), namespace)
    return threading.Thread(target=namespace["all_reduce"], args=(release,), daemon=True)


def stuck_in_user_code(release: threading.Event) -> threading.Thread:
    def sleep_in_forward(release: threading.Event) -> None:
        while not release.wait(0.01):
            pass

    return threading.Thread(target=sleep_in_forward, args=(release,), daemon=True)


def test_two_ranks_stall_and_only_the_one_outside_the_collective_is_ended(tmp_path):
    store, clock, release = dist.HashStore(), FakeClock(), threading.Event()
    mains = [in_a_collective(release), stuck_in_user_code(release)]
    ended: dict[int, int] = {}
    dogs = []
    for rank, main in enumerate(mains):
        main.start()
        beat = hang.Beat(step=12)
        place = Place(rank, 2, f"n{rank}", tmp_path / "hang", main.ident)
        dog = Watchdog(beat, hang.Budget(5.0, 50.0), place, store, clock=clock,
                       end=lambda status, rank=rank: ended.setdefault(rank, status))  # fmt: skip
        dog.timer = hang.StallTimer(dog.budget, first_step=0, now=clock())  # past its first step
        dog.timer.stalled_s(beat.step, hang.STEPS, clock())  # its last step was done now
        dogs.append(dog.start())
    try:
        time.sleep(0.3)
        assert not ended and not (tmp_path / "hang").exists()  # no time passed: no hang
        clock.now += 6.0
        for dog in dogs:
            dog.thread.join(timeout=60)
        assert ended == {1: exit_codes.HUNG}  # the rank in the collective waits to be ended
        verdict = json.loads((tmp_path / "hang" / VERDICT).read_text())
        assert (verdict["ranks"], verdict["hosts"], verdict["silent"]) == ([1], ["n1"], [])
        assert "rank 1 on n1 after step 12 (at " in verdict["message"]
        assert "in sleep_in_forward" in verdict["message"]
        wheres = {r["rank"]: (r["waiting"], r["where"]) for r in verdict["reports"]}
        assert wheres[0][0] and wheres[0][1].endswith("in all_reduce")
        assert not wheres[1][0] and wheres[1][1].endswith("in sleep_in_forward")
        for rank, frame in ((0, "all_reduce"), (1, "sleep_in_forward")):
            stacks = (tmp_path / "hang" / f"rank-{rank}.txt").read_text()
            assert stacks.startswith(f"rank {rank}/2 on n{rank}: no progress for 6 s")
            assert frame in stacks  # each rank's file holds the frame its main thread is in
    finally:
        release.set()


def test_a_watchdog_that_is_stopped_never_acts(tmp_path):
    clock, ended = FakeClock(), []
    place = Place(0, 1, "n0", tmp_path / "hang")
    dog = Watchdog(hang.Beat(), hang.Budget(0.1, 1.0), place, dist.HashStore(), clock=clock,
                   end=ended.append).start()  # fmt: skip
    dog.stop()
    clock.now += 100.0
    dog.thread.join(timeout=5)
    assert not dog.thread.is_alive() and not ended and not (tmp_path / "hang").exists()


def test_a_hang_in_the_last_step_names_the_rank_still_in_it(tmp_path):
    """Rank 0 finished training (its watchdog says so on stopping); rank 1 hangs in the last
    step: rank 1 is named at once, not rank 0 for staying silent."""
    store, clock, release = dist.HashStore(), FakeClock(), threading.Event()
    main = stuck_in_user_code(release)
    main.start()
    ended: dict[int, int] = {}
    dogs = []
    for rank, step in ((0, 96), (1, 95)):
        place = Place(rank, 2, f"n{rank}", tmp_path / "hang", main.ident)
        dog = Watchdog(hang.Beat(step=step), hang.Budget(5.0, 50.0), place, store, clock=clock,
                       end=lambda status, rank=rank: ended.setdefault(rank, status))  # fmt: skip
        dog.timer = hang.StallTimer(dog.budget, first_step=0, now=clock())
        dog.timer.stalled_s(step, hang.STEPS, clock())  # its last step was done now
        dogs.append(dog.start())
    try:
        dogs[0].stop()
        dogs[0].thread.join(timeout=5)
        assert store.check(["done/0"])
        clock.now += 6.0
        dogs[1].thread.join(timeout=60)
        assert ended == {1: exit_codes.HUNG}
        verdict = json.loads((tmp_path / "hang" / VERDICT).read_text())
        assert (verdict["ranks"], verdict["silent"]) == ([1], [])
    finally:
        release.set()


def test_stacks_come_from_py_spy_where_it_attaches_and_from_faulthandler_otherwise(
    tmp_path, monkeypatch
):
    release = threading.Event()
    stuck = stuck_in_user_code(release)
    stuck.start()
    try:
        tool = dump_stacks(tmp_path / "any.txt", "header line")
        assert tool in ("py-spy", "faulthandler")  # py-spy needs ptrace rights (root here)
        text = (tmp_path / "any.txt").read_text()
        assert text.startswith("header line\n") and "sleep_in_forward" in text
        monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))  # no py-spy to be found
        assert dump_stacks(tmp_path / "fallback.txt") == "faulthandler"
        assert "sleep_in_forward" in (tmp_path / "fallback.txt").read_text()
    finally:
        release.set()


def test_a_rank_too_stuck_to_report_is_named_with_its_host_and_the_decider_ends(tmp_path):
    """Rank 1's watchdog cannot run (its process holds the interpreter lock: here, a budget it
    never reaches stands in for that); rank 0 decides after the grace, names rank 1 and its
    host, and ends itself so that the step ends: the job script excludes the verdict's host."""
    store, clock, release = dist.HashStore(), FakeClock(), threading.Event()
    main = in_a_collective(release)
    main.start()
    ended: dict[int, int] = {}
    dogs = []
    for rank, budget in ((0, hang.Budget(5.0, 50.0)), (1, hang.Budget(1e6, 1e7))):
        place = Place(rank, 2, f"n{rank}", tmp_path / "hang", main.ident)
        dog = Watchdog(hang.Beat(step=12), budget, place, store, clock=clock,
                       end=lambda status, rank=rank: ended.setdefault(rank, status))  # fmt: skip
        dog.timer = hang.StallTimer(dog.budget, first_step=0, now=clock())
        dog.timer.stalled_s(12, hang.STEPS, clock())
        dogs.append(dog.start())
    try:
        time.sleep(1.5)  # both threads ran their first tick (rank 1's told the store its host)
        clock.now += 6.0  # rank 0 stalls, reports, decides: it waits for rank 1's report...
        wait_for_key(store, "claim")
        clock.now += 60.0  # ...until the grace runs out
        dogs[0].thread.join(timeout=60)
        assert ended == {0: exit_codes.HUNG}
        verdict = json.loads((tmp_path / "hang" / VERDICT).read_text())
        assert (verdict["ranks"], verdict["silent"], verdict["hosts"]) == ([1], [1], ["n1"])
        assert "rank 1 (silent: it holds the interpreter)" in verdict["message"]
    finally:
        dogs[1].stop()
        release.set()


def wait_for_key(store: dist.Store, key: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not store.check([key]):
        assert time.monotonic() < deadline, f"no {key} in the store after {timeout_s} s"
        time.sleep(0.05)
