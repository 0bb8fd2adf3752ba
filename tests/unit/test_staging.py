"""Node-local staging without a process group: one copy, reused, refreshed when changed."""

import os

import pytest

import hpcddp
from hpcddp.comm import staging
from hpcddp.errors import DownloadError


@pytest.fixture
def dataset(tmp_path):
    source = tmp_path / "shared" / "corpus"
    (source / "part").mkdir(parents=True)
    (source / "a.bin").write_bytes(b"a" * 1000)
    (source / "part" / "b.bin").write_bytes(b"b" * 24)
    return source


def test_a_directory_is_copied_whole_then_reused(dataset, tmp_path):
    local = tmp_path / "node-local"
    dest = hpcddp.stage(dataset, local)
    assert dest == local / "corpus"
    assert (dest / "part" / "b.bin").read_bytes() == b"b" * 24
    marker = local / "corpus.hpcddp-staged"
    before = marker.stat().st_mtime_ns
    assert hpcddp.stage(dataset, local) == dest and marker.stat().st_mtime_ns == before
    assert not [p for p in local.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_changed_source_is_copied_again(dataset, tmp_path):
    local = tmp_path / "node-local"
    dest = hpcddp.stage(dataset, local)
    (dataset / "a.bin").write_bytes(b"new")
    os.utime(dataset / "a.bin", ns=(1, 2_000_000_000_000_000_000))
    hpcddp.stage(dataset, local)
    assert (dest / "a.bin").read_bytes() == b"new"


def test_a_single_file_and_the_default_place(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("HPCDDP_STAGE_DIR", str(tmp_path / "scratch"))
    dest = hpcddp.stage(dataset / "a.bin")
    assert dest == tmp_path / "scratch" / "hpcddp-stage" / "a.bin" and dest.stat().st_size == 1000


def test_a_missing_source_is_one_line(tmp_path):
    with pytest.raises(DownloadError, match=r"cannot stage .*nope: it does not exist\. HINT"):
        staging.stage(tmp_path / "nope", tmp_path)
