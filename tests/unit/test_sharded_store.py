"""Sharded checkpoint folders: complete only with their marker, torn ones never listed and
removed by the next save, pruning never deletes the newest complete one, a truncated shard is
noticed; and the global batch a resume at another world size keeps (or refuses)."""

import json

import pytest

from hpcddp.config import Config, DataConfig, TrainConfig
from hpcddp.errors import CheckpointError, ConfigError
from hpcddp.launch.distenv import DistEnv
from hpcddp.records import attempts
from hpcddp.storage.checkpoint import CheckpointStore
from hpcddp.storage.sharded import ShardedStore
from hpcddp.train import resharding

SHAPE = {"world_size": 4, "strategy": "fsdp", "batch_size": 2, "grad_accum_steps": 3}


def _written(store: ShardedStore, step: int) -> None:
    path = store.open(step)
    (path / ".metadata").write_bytes(b"m" * 10)
    (path / "__0_0.distcp").write_bytes(b"s" * 100)
    store.complete(step, SHAPE)


def test_only_marked_folders_are_complete_and_the_next_save_removes_torn_ones(tmp_path):
    store = ShardedStore(tmp_path, keep_last=3)
    _written(store, 2)
    torn = store.open(4)  # a rank died while writing: shards, no metadata, no marker
    (torn / "__1_0.distcp").write_bytes(b"x")
    assert store.list_complete() == [(2, store.path_for(2))]
    assert attempts.saved_step(tmp_path) == 2
    _written(store, 6)
    assert not torn.exists()
    assert [s for s, _ in store.list_complete()] == [2, 6]


def test_pruning_keeps_the_newest_complete_and_never_the_one_just_written(tmp_path):
    store = ShardedStore(tmp_path, keep_last=2)
    for step in (2, 4, 6):
        _written(store, step)
    assert [s for s, _ in store.list_complete()] == [4, 6]
    store.open(8)  # a save in progress is no reason to delete a complete one
    assert [s for s, _ in store.list_complete()] == [4, 6]


def test_a_folder_without_metadata_is_never_marked_complete(tmp_path):
    store = ShardedStore(tmp_path)
    store.open(2)
    with pytest.raises(CheckpointError, match="no .metadata"):
        store.complete(2, SHAPE)
    assert store.list_complete() == []


def test_a_truncated_shard_is_noticed_before_loading(tmp_path):
    store = ShardedStore(tmp_path)
    _written(store, 2)
    path = store.path_for(2)
    assert store.check(path)["world_size"] == 4
    (path / "__0_0.distcp").write_bytes(b"s" * 50)
    with pytest.raises(CheckpointError, match="50 bytes, the marker says 100"):
        store.check(path)


def _env(world: int) -> DistEnv:
    return DistEnv(0, 0, world, world, 0, 1, "127.0.0.1", 29500, "local", "")


def _config(batch_size: int = 2, accum: int = 3) -> Config:
    return Config(data=DataConfig(batch_size=batch_size), train=TrainConfig(grad_accum_steps=accum))


@pytest.mark.parametrize("world, accum", [(4, 3), (2, 6), (3, 4), (1, 12), (6, 2)])
def test_resume_at_another_world_size_keeps_the_global_batch(tmp_path, world, accum):
    _written(ShardedStore(tmp_path), 6)  # 4 ranks x 2 samples x 3 micro-batches = 24
    kept = resharding.keep_global_batch(_config(), _env(world), tmp_path)
    assert kept.train.grad_accum_steps == accum
    assert kept.data.batch_size * world * kept.train.grad_accum_steps == 24


def test_a_global_batch_no_accumulation_can_keep_is_refused_with_sizes_that_work(tmp_path):
    _written(ShardedStore(tmp_path), 6)
    with pytest.raises(ConfigError) as refused:
        resharding.keep_global_batch(_config(), _env(5), tmp_path)
    text = str(refused.value)
    assert "global batch of 24 samples" in text and "HINT" in text
    assert "run on one of [1, 2, 3, 4, 6] ranks" in text and "data.batch_size to" not in text


def test_nothing_changes_without_a_checkpoint(tmp_path):
    config = _config()
    assert resharding.keep_global_batch(config, _env(3), tmp_path) is config


def test_the_marker_records_how_the_checkpoint_was_written(tmp_path):
    store = ShardedStore(tmp_path)
    _written(store, 6)
    record = json.loads((store.path_for(6) / "COMPLETE").read_text())
    assert {k: record[k] for k in SHAPE} == SHAPE
    assert record["files"] == {".metadata": 10, "__0_0.distcp": 100}


def _whole(run_dir, step: int, keep_last: int = 3) -> None:
    CheckpointStore(run_dir, keep_last).save(step, {"world_size": 4, "data": SHAPE})


def _steps(run_dir) -> list[tuple[int, str]]:
    """(step, kind) of every checkpoint left, whole or sharded, torn or not."""
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    return [(int(n[5:13]), n[14:]) for n in names if n.endswith((".pt", ".dcp"))]


def test_after_ddp_to_fsdp_pruning_counts_the_whole_checkpoints_too(tmp_path):
    for step in (2, 4, 6):
        _whole(tmp_path, step)
    store = ShardedStore(tmp_path, keep_last=3)
    _written(store, 8)  # fsdp now: one sharded checkpoint and three whole ones is four
    assert _steps(tmp_path) == [(4, "pt"), (6, "pt"), (8, "dcp")]
    assert not list((tmp_path / "checkpoints").glob("step-00000002.pt*"))  # sidecar gone too


def test_after_fsdp_to_ddp_pruning_removes_the_old_sharded_checkpoints(tmp_path):
    store = ShardedStore(tmp_path, keep_last=2)
    for step in (2, 4, 6):
        _written(store, step)
    _whole(tmp_path, 8, keep_last=2)
    assert _steps(tmp_path) == [(6, "dcp"), (8, "pt")]
    _whole(tmp_path, 10, keep_last=2)
    assert _steps(tmp_path) == [(8, "pt"), (10, "pt")]


def test_the_global_batch_kept_is_that_of_the_checkpoint_resume_will_load(tmp_path):
    store = ShardedStore(tmp_path)
    _written(store, 6)  # 4 ranks x 2 x 3 = 24
    path = store.open(8)
    (path / ".metadata").write_bytes(b"m" * 10)
    (path / "__0_0.distcp").write_bytes(b"s" * 100)
    store.complete(8, {**SHAPE, "world_size": 2})  # 2 ranks x 2 x 3 = 12
    (path / "__0_0.distcp").write_bytes(b"s" * 50)  # truncated: resume skips step 8 for 6
    kept = resharding.keep_global_batch(_config(), _env(2), tmp_path)
    assert kept.train.grad_accum_steps == 6  # step 6's 24 samples, not step 8's 12
