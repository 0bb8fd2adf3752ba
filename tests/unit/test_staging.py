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
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # HPCDDP_STAGE_DIR comes first
    dest = hpcddp.stage(dataset / "a.bin")
    assert dest == tmp_path / "scratch" / "hpcddp-stage" / "a.bin" and dest.stat().st_size == 1000
    monkeypatch.delenv("HPCDDP_STAGE_DIR")  # else $TMPDIR
    assert hpcddp.stage(dataset / "a.bin") == tmp_path / "tmp" / "hpcddp-stage" / "a.bin"


def test_each_change_alone_copies_again_file_count_size_newest_mtime(dataset, tmp_path):
    """docs/site-setup.md: the copy is reused unless the source changed in file count, size or
    newest mtime; each is enough on its own (the other two kept as they were)."""
    local, a = tmp_path / "node-local", dataset / "a.bin"
    dest = hpcddp.stage(dataset, local)
    old = a.stat().st_mtime_ns
    (dataset / "c.bin").write_bytes(b"")  # one more file: no bytes, an old mtime
    os.utime(dataset / "c.bin", ns=(1, 1))
    hpcddp.stage(dataset, local)
    assert (dest / "c.bin").exists()
    a.write_bytes(b"x" * 1001)  # one byte more, same mtime
    os.utime(a, ns=(old, old))
    hpcddp.stage(dataset, local)
    assert (dest / "a.bin").stat().st_size == 1001
    a.write_bytes(b"y" * 1001)  # same size and count, newer
    os.utime(a, ns=(old + 10**9, old + 10**9))
    hpcddp.stage(dataset, local)
    assert (dest / "a.bin").read_bytes() == b"y" * 1001


def test_a_missing_source_is_one_line(tmp_path):
    with pytest.raises(DownloadError, match=r"cannot stage .*nope: it does not exist\. HINT"):
        staging.stage(tmp_path / "nope", tmp_path)
