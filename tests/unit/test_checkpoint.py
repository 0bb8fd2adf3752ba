"""Tests for hpcddp.checkpoint: round trips, pruning, crashes, corruption, full disks."""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import xxhash

from hpcddp.errors import CheckpointError, HpcddpError
from hpcddp.records import attempts
from hpcddp.storage.atomic import atomic_write_bytes, atomic_write_text
from hpcddp.storage.checkpoint import CheckpointStore
from tests.fixtures.checkpoints import read, resumed, trainer_state

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
LOGGER = "hpcddp.train.whole_resume"  # resume's warnings


def _state(value: float = 0.0, step: int = 0) -> dict:
    """A trainer's checkpoint whose weights are all ``value`` (`resumed` reads them back)."""
    return trainer_state(value, step)


def _names(directory: pathlib.Path) -> list[str]:
    return sorted(os.listdir(directory))


def _write_sidecar(path: pathlib.Path) -> None:
    """An integrity record that matches ``path`` exactly, so only later checks can reject it:
    the first versions' (a whole-file sha256 in ``.sha256``)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    _older_record(path, f"{digest}  {path.name}\n")


def _older_record(path: pathlib.Path, text: str) -> pathlib.Path:
    """``path``'s integrity record as an earlier version left it: ``.sha256``, no ``.xxh3``."""
    path.with_name(path.name + ".xxh3").unlink(missing_ok=True)
    record = path.with_name(path.name + ".sha256")
    record.write_text(text)
    return record


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _warnings_naming(caplog, path: pathlib.Path) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == LOGGER and str(path) in r.getMessage()
    ]


# -- round trip and listing ----------------------------------------------------------------------


def test_round_trip_of_training_state_under_weights_only(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])},
        "step": 12,
        "loss": 0.25,
        "name": "run-a",
        "nested": [[1, 2.5, "x"], {"k": [3, 4]}],
    }
    store = CheckpointStore(tmp_path)
    path = store.save(12, state)

    assert path == tmp_path / "checkpoints" / "step-00000012.pt"
    loaded = read(store, path)
    assert store.latest_step() == 12
    assert loaded["rng"]["torch"].dtype == torch.uint8
    assert torch.equal(loaded["rng"]["torch"], state["rng"]["torch"])
    assert loaded["rng"]["python"] == state["rng"]["python"]
    assert (loaded["step"], loaded["loss"], loaded["name"]) == (12, 0.25, "run-a")
    assert loaded["nested"] == [[1, 2.5, "x"], {"k": [3, 4]}]
    for key, tensor in state["model"].items():
        assert torch.equal(loaded["model"][key], tensor)
    restored = torch.optim.AdamW(model.parameters(), lr=1e-3)
    restored.load_state_dict(loaded["optimizer"])
    assert restored.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]


def test_many_small_tensors_round_trip_and_torch_settings_are_restored(tmp_path):
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(200)])  # Merged writes.
    crc_before = torch.serialization.get_crc32_options()
    store = CheckpointStore(tmp_path)
    store.save(1, {"model": model.state_dict()})
    loaded = read(store, store.path_for(1))["model"]
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    assert torch.serialization.get_crc32_options() == crc_before
    assert torch.equal(
        torch.load(store.path_for(1), weights_only=True)["model"]["0.bias"], model[0].bias
    )  # Still a plain torch.save file.


def test_the_sidecar_names_xxh3_128_and_holds_the_digest_of_the_payload_bytes(tmp_path):
    store = CheckpointStore(tmp_path)
    path = store.save(7, {"w": torch.ones(4_000_003)})
    sidecar = path.with_name(path.name + ".xxh3").read_text()
    assert not path.with_name(path.name + ".sha256").exists()  # named for what it holds
    # What `xxhsum -H2 step-00000007.pt` prints, computed here from the bytes on disk.
    assert sidecar == f"xxh3-128:{xxhash.xxh3_128_hexdigest(path.read_bytes())}  {path.name}\n"


@pytest.mark.parametrize("megabytes", [0, 40])  # one short chunk; 2 full chunks and a short one
def test_a_chunked_sha256_sidecar_of_the_previous_version_still_verifies(tmp_path, megabytes):
    store = CheckpointStore(tmp_path)
    path = store.save(7, {"w": torch.ones(megabytes * 250_000 + 3)})
    by_hand = subprocess.run(  # how the previous version told users to check it
        "split -b 16M --filter='sha256sum | cut -c1-64' step-00000007.pt | sha256sum",
        shell=True,
        cwd=store.directory,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    _older_record(path, f"sha256-16MiB-chunks:{by_hand}  {path.name}\n")
    assert read(store, path)["w"].numel() == megabytes * 250_000 + 3
    _flip_middle(path)
    with pytest.raises(CheckpointError, match="is corrupt"):
        read(store, path)


def test_a_sidecar_with_an_old_and_a_new_scheme_verifies_the_payload_it_matches(tmp_path):
    """While a step saved by an older version is replaced, its sidecar lists both digests."""
    store = CheckpointStore(tmp_path)
    path = store.save(3, _state(1.0))
    new = path.with_name(path.name + ".xxh3").read_text().split()[0]
    stale = hashlib.sha256(b"the payload being replaced").hexdigest()
    path.with_name(path.name + ".xxh3").write_text(f"{stale}  x\n{new}  x\n")
    assert read(store, path).keys() == _state(1.0).keys()


def test_a_sidecar_an_earlier_version_named_sha256_still_verifies_until_the_step_is_saved_again(
    tmp_path,
):
    """Versions before named the sidecar ``.sha256`` whatever digest it held (an XXH3-128)."""
    store = CheckpointStore(tmp_path)
    path = store.save(3, _state(1.0, step=3))
    older = path.with_name(path.name + ".sha256")
    path.with_name(path.name + ".xxh3").rename(older)
    assert store.list_complete() == [(3, path)] and attempts.saved_step(tmp_path) == 3
    assert resumed(tmp_path) == (3, 1.0)
    store.save(3, _state(2.0, step=3))  # the step saved again: its record is named anew
    assert _names(store.directory) == ["step-00000003.pt", "step-00000003.pt.xxh3"]
    assert resumed(tmp_path) == (3, 2.0)
    _older_record(path, path.with_name(path.name + ".xxh3").read_text())
    _flip_middle(path)
    with pytest.raises(
        CheckpointError, match=r"is corrupt.*does not match step-00000003\.pt\.sha256"
    ):
        store.verify(path)


def test_a_sidecar_naming_an_unknown_algorithm_is_refused_with_the_known_ones(tmp_path):
    store = CheckpointStore(tmp_path)
    path = store.save(3, _state(1.0))
    path.with_name(path.name + ".xxh3").write_text(f"md5:{'0' * 32}  {path.name}\n")
    with pytest.raises(CheckpointError, match="unknown digest 'md5:0+'; expected xxh3-128:"):
        read(store, path)


def test_a_whole_file_sha256_sidecar_of_older_versions_still_verifies(tmp_path):
    store = CheckpointStore(tmp_path)
    path = store.save(3, _state(1.0, step=3))
    _write_sidecar(path)  # the old format: sha256sum of the whole file
    assert resumed(tmp_path) == (3, 1.0)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match="is corrupt"):
        store.verify(path)


def test_empty_store_has_no_checkpoint_and_creates_nothing(tmp_path):
    store = CheckpointStore(tmp_path / "run")
    assert store.list_complete() == []
    assert store.latest_step() is None
    assert resumed(tmp_path / "run") is None
    assert not (tmp_path / "run").exists()  # Non-zero ranks must not create directories.


@pytest.mark.parametrize(
    ("steps", "keep_last", "kept"),
    [
        ([1, 2, 3, 4, 5], 3, [3, 4, 5]),
        ([5, 17, 100, 101, 250], 3, [100, 101, 250]),
        ([7, 9000, 123456789], 1, [123456789]),
    ],
)
def test_keep_last_keeps_exactly_the_newest(tmp_path, steps, keep_last, kept):
    store = CheckpointStore(tmp_path, keep_last=keep_last)
    for step in steps:
        store.save(step, _state(step))

    assert [s for s, _ in store.list_complete()] == kept
    expected = sorted(n for s in kept for n in (f"step-{s:08d}.pt", f"step-{s:08d}.pt.xxh3"))
    assert _names(store.directory) == expected  # Pruned sidecars go too.
    assert store.latest_step() == kept[-1]


def test_prune_never_deletes_the_checkpoint_just_written(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    store.save(50, _state(50))
    path = store.save(10, _state(10))  # e.g. resumed from an older step after a bad one.
    assert path.exists()


def test_list_ignores_temp_files_sidecars_and_foreign_names(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(3, _state())
    for name in [
        ".step-00000009.pt.tmp-host-1",
        "step-00000009.pt.xxh3",
        "step-00000009.pt.sha256",
        "step-9.pt",
        "step-00000009.pt.bak",
        "notes.txt",
    ]:
        (store.directory / name).write_text("x")
    assert store.list_complete() == [(3, store.path_for(3))]


def test_saving_the_same_step_again_replaces_it(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(4, _state(1.0))
    store.save(4, _state(2.0))
    assert resumed(tmp_path) == (0, 2.0)
    assert len(store.path_for(4).with_name("step-00000004.pt.xxh3").read_text().splitlines()) == 1


def test_failed_resave_of_a_step_keeps_its_old_version(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    store.save(4, _state(1.0))

    def failing_commit(tmp, path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("hpcddp.storage.atomic.commit", failing_commit)
    with pytest.raises(CheckpointError, match="step 4 not saved.*Input/output error.*HINT:"):
        store.save(4, _state(2.0))
    assert resumed(tmp_path) == (0, 1.0)
    assert _names(store.directory) == ["step-00000004.pt", "step-00000004.pt.xxh3"]


# -- crashes mid-write ---------------------------------------------------------------------------


def test_leftover_temp_file_is_never_loaded_and_is_cleaned_by_next_save(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, _state(1.0))
    leftover = store.directory / f".step-00000002.pt.tmp-{socket.gethostname()}-{_dead_pid()}"
    leftover.write_bytes(b"half a checkpoint")

    orphan_record = store.directory / "step-00000002.pt.xxh3"  # Killed before the rename.
    orphan_record.write_text(f"xxh3-128:{'0' * 32}  step-00000002.pt\n")
    older_orphan = store.directory / "step-00000005.pt.sha256"  # an earlier version's
    older_orphan.write_text(f"{'0' * 64}  step-00000005.pt\n")

    assert resumed(tmp_path) == (0, 1.0)
    store.save(3, _state(3.0))
    assert not leftover.exists() and not orphan_record.exists() and not older_orphan.exists()


def test_temp_file_of_a_live_writer_is_left_alone(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, _state())
    live = store.directory / f".step-00000002.pt.tmp-{socket.gethostname()}-{os.getppid()}"
    live.write_bytes(b"being written")
    store.save(3, _state())
    assert live.exists()


_KILLED_SAVER = textwrap.dedent(
    """
    import os, sys, time, torch
    from hpcddp.storage.checkpoint import CheckpointStore
    real_write = os.write
    def slow_write(fd, data):  # Throttled so that the SIGKILL surely lands mid-write.
        written = real_write(fd, data[: 1 << 20])
        time.sleep(0.005)
        return written
    os.write = slow_write
    CheckpointStore(sys.argv[1]).save(2, {"w": torch.ones(50_000_000)})  # 200 MB
    """
)


def test_sigkill_during_save_keeps_previous_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, _state(1.0))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_SAVER, str(tmp_path)], env=env)
    try:
        temp = _wait_for_growing_temp(store.directory, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    assert temp.exists() and temp.stat().st_size < 200_000_000  # Really killed mid-write.
    assert [s for s, _ in store.list_complete()] == [1]
    assert resumed(tmp_path) == (0, 1.0)
    store.save(3, _state(3.0))
    assert not temp.exists()  # Its writer is dead, so the next save cleans it up.


def _wait_for_growing_temp(directory: pathlib.Path, proc: subprocess.Popen) -> pathlib.Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the saver exited before it could be killed"
        for name in os.listdir(directory):
            path = directory / name
            if name.startswith(".step-00000002.pt.tmp-") and path.stat().st_size > 0:
                return path
        time.sleep(0.002)
    raise AssertionError("the saver never started writing its temp file")


# -- corruption ----------------------------------------------------------------------------------


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_middle(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _empty_with_valid_record(path):
    path.write_bytes(b"")
    _write_sidecar(path)


def _text_with_valid_record(path):
    path.write_text("this is not a checkpoint\n")
    _write_sidecar(path)


def _missing_sidecar(path):
    path.with_name(path.name + ".xxh3").unlink()


def _garbage_sidecar(path):
    path.with_name(path.name + ".xxh3").write_text("not a digest\n")


def _garbage_older_sidecar(path):
    _older_record(path, "not a digest\n")


@pytest.mark.parametrize(
    "damage",
    [
        _truncate,
        _flip_middle,
        _empty_with_valid_record,
        _text_with_valid_record,
        _missing_sidecar,
        _garbage_sidecar,
        _garbage_older_sidecar,
    ],
)
def test_broken_latest_falls_back_with_warning(tmp_path, caplog, damage):
    store = CheckpointStore(tmp_path)
    store.save(1, _state(1.0))
    latest = store.save(2, _state(2.0))
    damage(latest)
    caplog.set_level(logging.WARNING, logger=LOGGER)

    assert resumed(tmp_path) == (0, 1.0)

    assert len(_warnings_naming(caplog, latest)) >= 1
    with pytest.raises(CheckpointError, match="HINT:"):
        read(store, latest)


def test_all_checkpoints_broken_raises_instead_of_restarting_from_zero(tmp_path, caplog):
    store = CheckpointStore(tmp_path)
    for step in (1, 2):
        _truncate(store.save(step, _state()))
    with pytest.raises(CheckpointError, match=r"none of the 2 checkpoints .* HINT:"):
        resumed(tmp_path)


class _Exploit:
    """Pickles to a call of os.system: loading it with full pickle would run the command."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_not_executed_and_falls_back(tmp_path, caplog):
    store = CheckpointStore(tmp_path / "run")
    store.save(1, _state(1.0))
    marker = tmp_path / "pwned"
    evil = store.path_for(2)
    torch.save({"model": _Exploit(marker)}, evil)
    _write_sidecar(evil)  # Valid integrity record: only weights_only stands in the way.
    caplog.set_level(logging.WARNING, logger=LOGGER)

    assert resumed(tmp_path / "run") == (0, 1.0)

    assert not marker.exists()
    assert len(_warnings_naming(caplog, evil)) >= 1


# -- write failures ------------------------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a 2 MiB tmpfs (needs root); unmounted afterwards whatever happens."""
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_disk_full_raises_clear_error_and_keeps_previous(tmpfs):
    store = CheckpointStore(tmpfs)
    store.save(1, {"w": torch.ones(10_000)})
    with pytest.raises(CheckpointError) as info:
        store.save(2, {"w": torch.ones(1_000_000)})  # 4 MB does not fit in 2 MiB.

    message = str(info.value)
    assert "disk is full" in message and "No space left" in message
    assert str(store.directory) in message and "needed at least 4000000 bytes" in message
    assert "HINT:" in message and "\n" not in message
    assert _names(store.directory) == ["step-00000001.pt", "step-00000001.pt.xxh3"]
    assert torch.equal(read(store, store.path_for(1))["w"], torch.ones(10_000))


def test_read_only_directory_raises_one_line_error_with_hint(tmpfs):
    store = CheckpointStore(tmpfs)
    store.save(1, _state(1.0))
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    with pytest.raises(CheckpointError) as info:
        store.save(2, _state(2.0))
    assert "Read-only file system" in str(info.value) and "HINT:" in str(info.value)
    assert "\n" not in str(info.value)
    assert resumed(tmpfs) == (0, 1.0)  # Resuming on a read-only filesystem still works.


def test_run_dir_under_a_regular_file_raises_one_line_error_with_hint(tmp_path):
    (tmp_path / "file.txt").write_text("not a directory")
    store = CheckpointStore(tmp_path / "file.txt" / "sub")
    with pytest.raises(CheckpointError) as info:
        store.save(1, _state())
    message = str(info.value)
    assert "cannot create checkpoint directory" in message and "HINT:" in message
    assert "\n" not in message
    assert isinstance(info.value, HpcddpError)


def test_unserialisable_state_leaves_no_trace(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, _state(1.0))
    with pytest.raises(CheckpointError, match="cannot be serialised.*HINT:"):
        store.save(2, {"fn": lambda: None})
    assert _names(store.directory) == ["step-00000001.pt", "step-00000001.pt.xxh3"]


@pytest.mark.parametrize(
    ("kwargs", "call"),
    [
        ({"keep_last": 0}, None),
        ({}, lambda s: s.save(-1, {})),
        ({}, lambda s: s.save(True, {})),
        ({}, lambda s: s.save(1, [1, 2])),
    ],
)
def test_invalid_arguments_raise_checkpoint_error(tmp_path, kwargs, call):
    with pytest.raises(CheckpointError, match="expected .*HINT:"):
        store = CheckpointStore(tmp_path, **kwargs)
        call(store)


# -- atomic writes -------------------------------------------------------------------------------


def test_atomic_write_replaces_content_and_leaves_no_temp(tmp_path):
    target = tmp_path / "summary.json"
    atomic_write_text(target, '{"a": 1}')
    atomic_write_bytes(target, b'{"a": 2}')
    assert target.read_text() == '{"a": 2}'
    assert _names(tmp_path) == ["summary.json"]


def test_atomic_write_failure_raises_oserror_and_keeps_old_file(tmp_path, monkeypatch):
    target = tmp_path / "config.yaml"
    target.write_text("old")

    def failing_replace(src, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert _names(tmp_path) == ["config.yaml"]
