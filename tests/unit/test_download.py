"""Guarded downloads against a loopback HTTP server: alone, and in a real 3-rank gloo group.

The multi-process tests start three ranks once (torch imports dominate their cost); each rank
runs every scenario in order and writes what it saw to a JSON file that the tests read.
"""

import hashlib
import io
import json
import logging
import os
import pathlib
import socket
import subprocess
import sys
import time
import types

import pytest

from hpcddp.comm import download as dl
from hpcddp.comm.download import bar_line, download, main_process_first
from hpcddp.errors import DownloadError
from hpcddp.progress import ProgressBar
from tests.fixtures.helpers import REPO, LoopbackServer

PAYLOAD = bytes(range(256)) * 4096 + b"tail"  # ~1 MiB, so streaming takes more than one chunk
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()
WRONG_SHA = "0" * 64
WORLD = 3
NODE_OF_RANK = (0, 0, 1)  # ranks 0 and 1 share node 0; rank 2 is alone on node 1
LOCAL_RANK = (0, 1, 0)


# --- a loopback server that counts requests ---------------------------------------------------


@pytest.fixture(scope="module")
def server():
    """Serves PAYLOAD at every path (``/missing...`` answers 404) and counts requests."""
    with LoopbackServer(PAYLOAD) as s:
        yield s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- one process ------------------------------------------------------------------------------


def test_http_download_writes_file(server, tmp_path):
    dest = download(f"{server.url}/one.bin", tmp_path / "sub" / "one.bin")
    assert dest == tmp_path / "sub" / "one.bin"
    assert dest.read_bytes() == PAYLOAD
    assert os.listdir(dest.parent) == ["one.bin"]  # no temporary file left behind


def test_file_url_is_copied_and_verified(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(PAYLOAD)
    dest = download(src.as_uri(), tmp_path / "out" / "copy.bin", PAYLOAD_SHA.upper())
    assert dest.read_bytes() == PAYLOAD


def test_missing_file_url_names_it(tmp_path):
    url = (tmp_path / "nope.bin").as_uri()
    with pytest.raises(DownloadError, match="could not fetch file://.*nope.bin.*HINT"):
        download(url, tmp_path / "x.bin")


def test_checksum_ok(server, tmp_path):
    dest = download(f"{server.url}/ok.bin", tmp_path / "ok.bin", PAYLOAD_SHA)
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == PAYLOAD_SHA


def test_checksum_mismatch_leaves_nothing(server, tmp_path):
    with pytest.raises(DownloadError) as err:
        download(f"{server.url}/bad.bin", tmp_path / "bad.bin", WRONG_SHA)
    message = str(err.value)
    assert WRONG_SHA in message and PAYLOAD_SHA in message and "HINT:" in message
    assert os.listdir(tmp_path) == []


def test_http_404_names_url(server, tmp_path):
    url = f"{server.url}/missing.bin"
    with pytest.raises(DownloadError, match=f"{url}: HTTP 404.*HINT"):
        download(url, tmp_path / "m.bin")
    assert os.listdir(tmp_path) == []


def test_connection_refused_names_url(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}/x.bin"
    with pytest.raises(DownloadError, match=f"could not fetch {url}: .*refused.*HINT"):
        download(url, tmp_path / "x.bin")


@pytest.mark.parametrize("sha", [None, PAYLOAD_SHA])
def test_second_run_skips_the_network(server, tmp_path, sha):
    url = f"{server.url}/again-{sha is None}.bin"
    download(url, tmp_path / "a.bin", sha)
    before = server.count(url.removeprefix(server.url))
    assert before == 1
    download(url, tmp_path / "a.bin", sha)
    assert server.count(url.removeprefix(server.url)) == before


def test_existing_wrong_file_is_downloaded_again(server, tmp_path):
    dest = tmp_path / "w.bin"
    dest.write_bytes(b"stale")
    download(f"{server.url}/w.bin", dest, PAYLOAD_SHA)
    assert dest.read_bytes() == PAYLOAD
    assert server.count("/w.bin") == 1


@pytest.mark.parametrize(
    "url, sha, match",
    [
        ("ftp://host/x", None, "scheme 'ftp'"),
        ("/abs/path", None, "file:///abs/path"),
        ("http://host/x", "abc", "not a SHA-256"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(tmp_path, url, sha, match):
    with pytest.raises(DownloadError, match=match):
        download(url, tmp_path / "x", sha)


def test_main_process_first_alone_just_runs_and_passes_errors_through():
    ran = []
    with main_process_first():
        ran.append(1)
    assert ran == [1]
    with pytest.raises(ValueError, match="boom"), main_process_first():
        raise ValueError("boom")


def test_progress_bar_only_on_a_terminal(server, tmp_path, capsys):
    download(f"{server.url}/quiet.bin", tmp_path / "q.bin")  # pytest's stderr is no tty
    assert capsys.readouterr().err == ""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    bar = dl._Progress("f.bin", 2_000_000, stream=stream)
    bar.update(1_000_000)
    bar.update(1_000_000)
    bar.close()
    last = stream.getvalue().split("\r\033[K")[-1]  # drawn by hpcddp.progress.ProgressBar
    assert last.startswith("f.bin [" + "#" * 30 + "] 2.0/2.0 MB ") and last.endswith(" MB/s\n")


def test_bar_line():
    assert bar_line("x", 500_000, 1_000_000, 1.0, width=10) == "x [#####-----] 0.5/1.0 MB 0.5 MB/s"
    assert bar_line("x", 2_000_000, None, 2.0) == "x 2.0 MB 1.0 MB/s"


def test_verdict_needs_one_fetcher_per_node():
    outcomes = [
        dl._Outcome(0, "h0", "0", True, "d"),
        dl._Outcome(1, "h0", "0", False, "d"),
        dl._Outcome(2, "h1", "1", False, "d"),
    ]
    assert "node 1: ranks []" in dl._verdict(outcomes, local=True)
    assert dl._verdict(outcomes, local=False) is None


@pytest.fixture
def world_of_one():
    """A real one-rank gloo group in this process, gone again after the test."""
    import torch.distributed as dist

    def start():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    start()
    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def test_the_guard_waits_on_the_one_side_group_with_its_own_timeout(world_of_one, monkeypatch):
    import torch.distributed as dist

    from hpcddp.comm import sidegroup

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)  # a side group is made
    shared = sidegroup.side_group()
    group = dl._status_group(5.0, "d")
    assert group is shared and sidegroup._timeout_of(group).total_seconds() == 5.0
    assert sidegroup.side_group() is shared  # the next user gets it back, with its timeout
    assert sidegroup._timeout_of(shared) == sidegroup.job_timeout()
    dist.destroy_process_group()
    world_of_one()
    assert dl._status_group(5.0, "d") is not group  # a new world gets a new group


def test_seat_from_env_vars_or_a_dist_env(world_of_one):
    seat = dl._seat(None, True, "d", {"LOCAL_RANK": "0", "GROUP_RANK": "4"})
    assert (seat.fetcher, seat.node, seat.problem) == (True, "4", None)
    assert "LOCAL_RANK=''" in dl._seat(None, True, "d", {}).problem
    assert dl._seat(None, False, "d", {}).fetcher  # rank 0 needs no LOCAL_RANK
    env = types.SimpleNamespace(rank=0, local_rank=1, node_rank=2, hostname="n2")
    seat = dl._seat(env, True, "d", {})
    assert (seat.fetcher, seat.node, seat.host) == (False, "2", "n2")
    other = types.SimpleNamespace(**{**vars(env), "rank": 5})
    assert "DistEnv for rank 5" in dl._seat(other, True, "d", {}).problem


# --- three ranks in a real gloo group ---------------------------------------------------------


def _scenarios(url: str, tmp: pathlib.Path, node: int) -> dict:
    """What one rank sees in each scenario; run in every rank, in the same order."""
    shared = tmp / "shared"
    return {
        "a": lambda: download(f"{url}/a.bin", shared / "a.bin", PAYLOAD_SHA),
        "a_again": lambda: download(f"{url}/a.bin", shared / "a.bin", PAYLOAD_SHA),
        "b": lambda: download(f"{url}/b.bin", tmp / f"node{node}" / "b.bin", local=True),
        "c_sha": lambda: download(f"{url}/c.bin", shared / "c.bin", WRONG_SHA, timeout_s=600),
        "c_404": lambda: download(f"{url}/missing-c.bin", shared / "c.bin", timeout_s=600),
        # only node 1's fetcher fails; node 0 must not carry on alone
        "e_one_node": lambda: download(
            f"{url}/{'missing-e' if node else 'e'}.bin",
            tmp / f"node{node}" / "e.bin",
            local=True,
            timeout_s=600,
        ),
        "d": lambda: _failing_body(),
    }


def _failing_body() -> None:
    import torch.distributed as dist

    with main_process_first(timeout_s=600, description="preparing data"):
        if dist.get_rank() == 0:
            raise ValueError("boom from the first rank")


def _worker(rank: int, url: str, tmp: pathlib.Path) -> None:
    """One rank: join the group, run every scenario, record outcomes and timings."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method="env://",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    seen = {}
    for name, run in _scenarios(url, tmp, NODE_OF_RANK[rank]).items():
        start = time.monotonic()
        try:
            path = run()
            seen[name] = {
                "ok": True,
                "path": str(path),
                "sha": path and hashlib.sha256(path.read_bytes()).hexdigest(),
            }
        except DownloadError as err:
            seen[name] = {"ok": False, "error": str(err)}
        except Exception as err:  # recorded so the test shows it instead of a bare exit code
            seen[name] = {"ok": False, "error": f"UNEXPECTED {type(err).__name__}: {err}"}
        seen[name]["elapsed_s"] = time.monotonic() - start
    seen["host"] = socket.gethostname()
    (tmp / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_run(server, tmp_path_factory):
    """Start three ranks once; return (server, tmp dir, per-rank results, exit codes)."""
    tmp = tmp_path_factory.mktemp("gloo")
    port = _free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(
            os.environ,
            PYTHONPATH=str(REPO),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(WORLD),
            LOCAL_RANK=str(LOCAL_RANK[rank]),
            GROUP_RANK=str(NODE_OF_RANK[rank]),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, str(rank), server.url, str(tmp)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs, codes = [], []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the ranks hung; a failed fetch must not leave the others waiting")
        codes.append(p.returncode)
    assert codes == [0] * WORLD, "\n".join(outputs)
    results = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return server, tmp, results


@pytest.mark.slow
def test_one_fetch_for_the_whole_job(gloo_run):
    server, tmp, results = gloo_run
    assert server.count("/a.bin") == 1  # the second round found the file: still one request
    for r in results:
        assert r["a"]["ok"] and r["a_again"]["ok"], r
        assert r["a"]["sha"] == PAYLOAD_SHA
        assert r["a"]["path"] == str(tmp / "shared" / "a.bin")


@pytest.mark.slow
def test_local_fetches_once_per_node(gloo_run):
    server, tmp, results = gloo_run
    assert server.count("/b.bin") == 2
    assert all(r["b"]["ok"] and r["b"]["sha"] == PAYLOAD_SHA for r in results), results
    assert (tmp / "node0" / "b.bin").is_file() and (tmp / "node1" / "b.bin").is_file()


@pytest.mark.slow
@pytest.mark.parametrize(
    "scenario, words",
    [
        ("c_sha", [WRONG_SHA, PAYLOAD_SHA, "checksum mismatch", "HINT:"]),
        ("c_404", ["/missing-c.bin", "HTTP 404", "HINT:"]),
        ("e_one_node", ["/missing-e.bin", "HTTP 404", "rank 2"]),
        ("d", ["preparing data failed on rank 0", "ValueError: boom from the first rank"]),
    ],
)
def test_a_failed_first_rank_fails_every_rank_quickly(gloo_run, scenario, words):
    _server, tmp, results = gloo_run
    messages = {r[scenario].get("error") for r in results}
    assert len(messages) == 1 and None not in messages, messages  # same error on every rank
    message = messages.pop()
    assert not message.startswith("UNEXPECTED"), message
    for word in [*words, results[0]["host"]]:
        assert word in message
    assert max(r[scenario]["elapsed_s"] for r in results) < 20  # timeout_s was 600
    assert not (tmp / "shared" / "c.bin").exists()
    if scenario == "c_sha":
        assert not [f for f in os.listdir(tmp / "shared") if f.endswith(".part")]


if __name__ == "__main__":
    _worker(int(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3]))


def test_download_progress_draws_through_the_shared_bar(caplog):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    progress = dl._Progress("g.bin", None, stream=stream)
    assert isinstance(progress.bar, ProgressBar) and not hasattr(dl, "REDRAW_S")
    progress.update(500_000)
    progress.update(500_000)  # within the bar's redraw interval: not drawn again
    progress.close()
    assert stream.getvalue().count("\r\033[K") == 2 and stream.getvalue().endswith("\n")

    quiet = io.StringIO()  # not a terminal: nothing drawn, one log line at the end
    with caplog.at_level(logging.INFO, logger="hpcddp.comm.download"):
        progress = dl._Progress("g.bin", 1_000_000, stream=quiet)
        progress.update(1_000_000)
        progress.close()
    assert quiet.getvalue() == "" and "downloaded g.bin: 1.0 MB" in caplog.text
