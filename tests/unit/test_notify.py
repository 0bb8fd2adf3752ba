"""Webhook notices (``notify.url``): what is posted, by whom, in which order, and that a webhook
that is dead or never answers costs the caller nothing but one line in the log.

Every test posts to a real HTTP server on 127.0.0.1 (`tests.fixtures.webhook.Receiver`).
"""

import json
import logging
import socket
import time

import pytest

from hpcddp.config import load_config
from hpcddp.errors import ConfigError
from hpcddp.notify import poster
from hpcddp.notify.notices import Notifier, shell_tells_failures
from hpcddp.records import attempts
from hpcddp.run_events import Event
from hpcddp.slurm import policy
from tests.fixtures.webhook import Receiver

JOB = {"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "n[1-2]"}
KILLED = "srun: error: n2: task 3: Killed"


def notifier(url: str, *overrides: str, speaks: bool = True, environ=JOB) -> Notifier:
    config = load_config(None, [f"notify.url={url}", "run.dir=/runs/a", "run.name=a", *overrides])
    return Notifier(config, environ, speaks=speaks)


def test_a_notice_carries_event_run_job_step_and_a_slack_text():
    with Receiver() as receiver:
        told = notifier(receiver.url)
        told.tell(Event.PREEMPTED, 40, "checkpoint saved, requeued")
        told.close()
        (body,) = receiver.wait_for(1)
    assert receiver.paths == ["/hook?token=t"]  # path and query as given
    assert {k: body[k] for k in ("event", "run", "name", "job", "step")} == {
        "event": "preempted",
        "run": "/runs/a",
        "name": "a",
        "job": "12",
        "step": 40,
    }
    # the JSON webhook's body is what it always was: these keys, this text
    assert sorted(body) == ["event", "job", "name", "run", "step", "text", "time"]
    assert body["text"] == (
        "hpcddp run a (/runs/a), job 12: preempted at step 40: checkpoint saved, requeued"
    )
    assert Notifier(load_config(None, []), {}, speaks=True).job == "local"
    array = {"SLURM_JOB_ID": "31", "SLURM_ARRAY_JOB_ID": "30", "SLURM_ARRAY_TASK_ID": "1"}
    assert notifier(receiver.url, environ=array).job == "30_1"  # as Slurm names a task


def test_a_slack_or_mattermost_webhook_gets_one_readable_line_beside_the_json_one():
    with Receiver() as json_hook, Receiver() as chat:
        told = notifier(json_hook.url, f"notify.slack_url={chat.url}", "notify.events=[preempted]")
        told.tell(Event.STARTED, 0)  # not chosen: neither receiver gets it
        told.tell(Event.PREEMPTED, 40, "checkpoint saved, requeueing")
        told.close()
        (line,), (body,) = chat.wait_for(1), json_hook.wait_for(1)
        time.sleep(0.2)  # anything more would have arrived by now
    host = socket.gethostname()
    assert line == {
        "text": f"hpcddp a: preempted at step 40 on {host} (job 12): checkpoint saved, requeueing"
    }
    assert (body["event"], len(chat.bodies), len(json_hook.bodies)) == ("preempted", 1, 1)
    alone = notifier("", f"notify.slack_url={chat.url}")
    assert [type(sink).__name__ for sink in alone.sinks] == ["ChatWebhook"]


def test_only_the_chosen_events_are_posted_and_only_by_the_process_that_speaks():
    with Receiver() as receiver:
        rank0 = notifier(receiver.url, "notify.events=[completed,failed]")
        rank1 = notifier(receiver.url, "notify.events=[completed,failed]", speaks=False)
        for told in (rank0, rank1):
            told.tell(Event.STARTED, 0)
            told.tell(Event.COMPLETED, 64)
            told.close()
        receiver.wait_for(1)
        time.sleep(0.2)  # anything more would have arrived by now
    assert receiver.events() == ["completed"]
    assert notifier("", speaks=True).sinks == []  # no URL: off


def test_posts_arrive_in_the_order_they_were_told():
    order = ["started", "nan", "hang", "restarted", "preempted", "requeued", "failed", "completed"]
    with Receiver() as receiver:
        told = notifier(receiver.url)
        for step, event in enumerate(order):
            told.tell(Event(event), step)
        told.close()
        receiver.wait_for(len(order))
    assert receiver.events() == order


def test_a_webhook_that_never_answers_costs_the_caller_nothing(caplog):
    with Receiver(answer=False) as receiver:
        told = notifier(receiver.url, "notify.timeout_s=2")
        began = time.perf_counter()
        told.tell(Event.COMPLETED, 64)
        (sink,) = told.sinks
        assert sink.close(poster.LEAVE_GRACE_S)  # the post left (waited for; never the answer)
        one = time.perf_counter() - began
        began = time.perf_counter()
        for event in (Event.STARTED, Event.PREEMPTED):
            told.tell(event, 1)
        telling = time.perf_counter() - began
        told.close()  # each waits ORDER_WAIT_S for the answer before it: leaving gives up
        three = time.perf_counter() - began
        bodies = receiver.wait_for(3)
        with caplog.at_level(logging.WARNING, logger="hpcddp.notify"):
            # each post's own timeout, while the receiver still holds it: not the receiver's
            # closing, and not the "given up" line leaving may add (the third post is sent
            # about when leaving's grace ends)
            deadline = time.monotonic() + 10
            while len(unanswered(caplog)) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            lines = [r.getMessage() for r in caplog.records]
    print(f"never answers: one post told and left in {one * 1000:.1f} ms; two more told in "
          f"{telling * 1000:.1f} ms, left in {three * 1000:.0f} ms")  # fmt: skip
    # the answers' timeout is 2 s: nothing waited for them (generous bounds: a loaded machine)
    assert one < 1.5 and telling < 0.5
    assert three < poster.LEAVE_GRACE_S + 0.3
    assert [b["event"] for b in bodies] == ["completed", "started", "preempted"]
    assert len(unanswered(caplog)) == 3 and all("timed out" in x for x in unanswered(caplog))
    assert all(line.startswith("notify: ") and "\n" not in line for line in lines)


def unanswered(caplog) -> list[str]:
    """The log's "no answer" lines so far."""
    lines = [r.getMessage() for r in caplog.records]
    return [line for line in lines if line.startswith("notify: no answer from")]


def test_a_dead_webhook_is_one_line_in_the_log_and_nothing_else(caplog):
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    told = notifier(f"http://127.0.0.1:{port}/hook")
    with caplog.at_level(logging.WARNING, logger="hpcddp.notify"):
        told.tell(Event.FAILED, 3, "task 3 on n2: Killed")
        assert [sink.close(poster.LEAVE_GRACE_S) for sink in told.sinks] == [True]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"notify: could not post 'failed' to http://127.0.0.1:{port}/hook: ")
    assert "\n" not in line


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("notify.url=ftp://host/hook", "notify.url='ftp://host/hook' is not an http(s) URL"),
        ("notify.url=hooks.slack.com/x", "is not an http(s) URL"),
        ("notify.slack_url=hooks.slack.com/x", "notify.slack_url='hooks.slack.com/x' is not an"),
        ("notify.events=[started,finished]", "notify.events='finished' is not one of"),
        ("notify.timeout_s=0", "notify.timeout_s must be > 0"),
    ],
)
def test_a_bad_notify_setting_is_refused_in_one_line_with_a_hint(override, words):
    with pytest.raises(ConfigError, match="HINT") as raised:
        load_config(None, [override])
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_rank_zero_leaves_failures_to_the_batch_shell_of_hpcddp_s_job_script():
    assert shell_tells_failures({"SLURM_JOB_ID": "12", "HPCDDP_JOB_END_TIME": "12@1700000000"})
    # a job started inside another hpcddp job inherits its outer mark, which is not its own
    assert not shell_tells_failures({"SLURM_JOB_ID": "13", "HPCDDP_JOB_END_TIME": "12@17000"})
    assert not shell_tells_failures({"SLURM_JOB_ID": "12"})  # submitit, srun by hand
    assert not shell_tells_failures({})  # local


def _run_dir_at_step_30(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for name in ("step-00000030.pt", "step-00000030.pt.sha256"):  # what CheckpointStore leaves
        (run_dir / "checkpoints" / name).write_text("x")
    return run_dir


def test_the_job_script_s_helper_tells_a_requeue_then_the_failure_that_ends_the_job(tmp_path):
    run_dir = _run_dir_at_step_30(tmp_path)
    with Receiver() as receiver:
        states = "n1 idle\nn2 idle\nn3 idle"
        argv = ["after", "--status", "137", "--srun-errors", KILLED, "--node-states", states]
        argv += [f"run.dir={run_dir}", f"notify.url={receiver.url}"]
        assert policy.main(argv, {**JOB, "SLURM_RESTART_COUNT": "0"}) == 0
        receiver.wait_for(1)  # the job script's helper is a process per step, seconds apart
        assert policy.main(argv, {**JOB, "SLURM_RESTART_COUNT": "1"}) == 0  # gained nothing
        first, second = receiver.wait_for(2)
    assert (first["event"], first["job"], first["step"]) == ("requeued", "12", 30)
    said = "task 3 on n2: Killed; requeueing job 12 without n2 (failure 1 of at most 2; "
    assert first["text"].endswith(said + "this attempt saved 30 steps)")
    assert second["event"] == "failed" and "this retry gained no step" in second["text"]


def test_the_job_script_s_helper_tells_a_chat_channel_too(tmp_path):
    run_dir = _run_dir_at_step_30(tmp_path)
    with Receiver() as chat:
        argv = [
            "after",
            "--status",
            "137",
            "--srun-errors",
            KILLED,
            "--node-states",
            "n1 idle\nn2 idle\nn3 idle",
        ]
        argv += [f"run.dir={run_dir}", "run.name=a", f"notify.slack_url={chat.url}"]
        assert policy.main(argv, {**JOB, "SLURM_RESTART_COUNT": "0"}) == 0
        ((key, line),) = chat.wait_for(1)[0].items()
    assert key == "text" and line.startswith("hpcddp a: requeued at step 30 on ")
    assert "(job 12): task 3 on n2: Killed; requeueing job 12 without n2" in line


def test_a_hang_is_told_before_what_follows_it(tmp_path):
    run_dir = _run_dir_at_step_30(tmp_path)
    found = attempts.hang_dir(run_dir, "12", 0)
    found.mkdir(parents=True)
    (found / "verdict.json").write_text(json.dumps({"hosts": ["n2"], "ranks": [3], "detected": 1}))
    with Receiver() as receiver:
        argv = ["after", "--status", "124", "--hosts", "n1,n2", "slurm.spare_nodes=1"]
        argv += [
            f"run.dir={run_dir}",
            f"notify.url={receiver.url}",
            "notify.events=[hang,restarted]",
        ]
        assert policy.main(argv, {**JOB, "SLURM_JOB_NODELIST": "n[1-3]"}) == 0
        hang, restarted = receiver.wait_for(2)
    assert (hang["event"], restarted["event"]) == ("hang", "restarted")
    assert hang["text"].endswith("at step 30: rank 3 on n2: hung")
    assert "restarting in job 12 on n1,n3 without n2" in restarted["text"]


def test_leaving_waits_at_most_one_second_in_all_for_posts_that_cannot_leave(caplog):
    """The docs' bound: leaving waits at most 1 s for posts not yet sent, however many
    receivers there are (one grace in all, not one per sink). Both sinks post to a listener
    whose accept queue is full, so their connections hang until `notify.timeout_s` (10 s)."""
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        url = f"http://127.0.0.1:{full.getsockname()[1]}/hook"
        with socket.create_connection(full.getsockname()):  # fills the queue of one
            told = notifier(url, f"notify.slack_url={url}", "notify.timeout_s=10")
            told.tell(Event.COMPLETED, 64)
            began = time.monotonic()
            with caplog.at_level(logging.WARNING, logger="hpcddp.notify"):
                told.close()
            left = time.monotonic() - began
    assert len(told.sinks) == 2
    assert 0.5 < left < 1.0 + 0.3  # the grace was used, once, and no more
    assert any("given up" in r.getMessage() for r in caplog.records)


def test_a_post_waits_at_most_half_a_second_for_the_answer_to_the_one_before():
    """docs/notifications.md: each post leaves after the one before it was answered or 0.5 s
    passed, so a receiver that never answers delays the next post by 0.5 s, not its timeout."""
    with Receiver(answer=False) as receiver:
        told = notifier(receiver.url, "notify.timeout_s=10")
        told.tell(Event.STARTED, 0)
        told.tell(Event.COMPLETED, 64)
        receiver.wait_for(2)
        told.close()
        gap = receiver.arrived[1] - receiver.arrived[0]
    assert 0.5 - 0.1 < gap < 0.5 + 0.5  # waited for the answer, but 0.5 s at most
