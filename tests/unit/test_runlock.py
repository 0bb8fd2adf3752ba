"""One run per run directory: the second is refused naming the first; the dead hold nothing."""

import errno
import fcntl
import json
import os
import socket
import subprocess
import sys

import pytest

from hpcddp.config import load_config
from hpcddp.errors import ConfigError
from hpcddp.records import rundir
from hpcddp.storage.runlock import RunLock
from tests.fixtures.helpers import QUICKSTART

HOLD = """
import pathlib, sys, time
from hpcddp.storage.runlock import RunLock
RunLock(pathlib.Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_run_is_refused_naming_the_first_and_gets_in_once_it_ends(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        with pytest.raises(ConfigError) as refused:
            RunLock(tmp_path).acquire()
        message = str(refused.value)
        assert f"is in use by another run (host {socket.gethostname()}, pid {holder.pid}" in message
        assert "HINT: wait for it to end, or give this run its own run.dir" in message
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock(tmp_path)
    lock.acquire()  # the kernel let go of the dead holder's flock
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    lock.release()


def test_release_lets_the_next_run_in(tmp_path):
    first = RunLock(tmp_path)
    first.acquire()
    first.release()
    second = RunLock(tmp_path)
    second.acquire()
    second.release()


@pytest.fixture
def no_flock(monkeypatch):
    """A file system without flock (Lustre mounted without -o flock, say)."""

    def refuse(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)


@pytest.mark.parametrize(
    "holder, taken_over",
    [
        ({"host": socket.gethostname(), "pid": 2**22 + 12345}, True),  # a dead pid here
        ({"host": socket.gethostname(), "pid": os.getpid()}, False),  # alive
        ({"host": "another-node", "pid": 1}, False),  # cannot be checked: assume alive
        ({"host": "another-node", "pid": 1, "job_id": "77"}, True),  # this job's earlier attempt
    ],
)
def test_without_flock_an_exclusive_file_stands_in(tmp_path, no_flock, monkeypatch, holder,
                                                   taken_over):  # fmt: skip
    (tmp_path / ".lock").write_text(json.dumps(holder))
    lock = RunLock(tmp_path, job_id="77")  # this process belongs to job 77
    if taken_over:
        lock.acquire()
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
        lock.release()
        assert not (tmp_path / ".lock").exists()
    else:
        with pytest.raises(ConfigError, match=f"in use by another run \\(host {holder['host']}"):
            lock.acquire()


def test_prepare_takes_the_lock_before_touching_the_config(tmp_path):
    config = load_config(QUICKSTART, [f"run.dir={tmp_path}"])
    holder = RunLock(tmp_path)
    holder.acquire()
    try:
        with pytest.raises(ConfigError, match="in use by another run"):
            rundir.prepare(config, lock=RunLock(tmp_path))
        assert not (tmp_path / "config.yaml").exists()
    finally:
        holder.release()


@pytest.mark.parametrize(
    "content, words",
    [
        ("optim: {lr: [unclosed\n", "unreadable"),
        ("- just\n- a list\n", "not a mapping"),
        (b"\xff\xfe garbage", "unreadable"),
    ],
)
def test_a_damaged_saved_config_is_reported_not_crashed_on(tmp_path, content, words):
    tmp_path.joinpath("config.yaml").write_bytes(
        content if isinstance(content, bytes) else content.encode()
    )
    with pytest.raises(ConfigError, match=f"config.yaml is damaged: .*{words}.*HINT: "):
        rundir.prepare(load_config(QUICKSTART, [f"run.dir={tmp_path}"]))
    forced = load_config(QUICKSTART, [f"run.dir={tmp_path}", "run.force=true"])
    assert rundir.prepare(forced) == tmp_path  # force replaces it
