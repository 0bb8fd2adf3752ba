"""Sharded checkpoints carry a digest of every file, written by the background save and checked
while loading: one flipped byte in a shard makes resume skip that checkpoint for the previous
complete one, and say which file failed; ``checkpoint inspect --verify`` names it too.

One process, no process group: the trainer's own save and resume path
(`hpcddp.train.sharded_checkpointing.ShardedCheckpointer`) on a small model."""

import json
import logging

import pytest
import torch

from hpcddp.config import Config
from hpcddp.errors import CheckpointError
from hpcddp.launch.distenv import DistEnv
from hpcddp.storage.checkpoint_tools import inventory
from hpcddp.storage.sharded import ShardedStore
from hpcddp.train.checkpointing import Trained
from hpcddp.train.sharded_checkpointing import ShardedCheckpointer
from hpcddp.train.state import Progress

ENV = DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 29500, "local", "")


def _trained(seed: int) -> Trained:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return Trained(model, optimizer, scheduler, None)


def _saved_twice(run_dir) -> tuple[Trained, dict[str, torch.Tensor]]:
    """Checkpoints at steps 2 and 4 (the weights changed in between); step 2's weights."""
    trained = _trained(0)
    saver = ShardedCheckpointer(run_dir, Config(), ENV, trained)
    saver.save(Progress(step=2), epoch_done=False)
    saver.wait()
    at_two = {k: v.clone() for k, v in trained.model.state_dict().items()}
    trained.model(torch.randn(2, 64)).sum().backward()
    trained.optimizer.step()
    saver.save(Progress(step=4), epoch_done=False)
    saver.wait()
    return trained, at_two


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_every_file_of_a_sharded_checkpoint_has_a_digest_in_its_marker(tmp_path):
    _saved_twice(tmp_path)
    record = json.loads((ShardedStore(tmp_path).path_for(4) / "COMPLETE").read_text())
    assert set(record["digests"]) == set(record["files"]) >= {".metadata", "__0_0.distcp"}
    assert all(token.startswith("xxh3-128:") for token in record["digests"].values())


@pytest.mark.parametrize("corrupt", ["__0_0.distcp", ".metadata", "extras.pt"])
def test_a_flipped_byte_resumes_from_the_previous_checkpoint(tmp_path, caplog, corrupt):
    _saved_twice(tmp_path)
    _flip_a_byte(ShardedStore(tmp_path).path_for(4) / corrupt)  # same size: the digest tells
    fresh = _trained(1)
    with caplog.at_level(logging.WARNING):
        progress = ShardedCheckpointer(tmp_path, Config(), ENV, fresh).resume()
    assert progress is not None and progress.step == 2
    assert f"{corrupt} does not match its digest" in caplog.text


def test_resume_loads_step_two_weights_after_the_corrupt_step_four(tmp_path):
    _, at_two = _saved_twice(tmp_path)
    _flip_a_byte(ShardedStore(tmp_path).path_for(4) / "__0_0.distcp")
    fresh = _trained(1)
    ShardedCheckpointer(tmp_path, Config(), ENV, fresh).resume()
    for name, tensor in fresh.model.state_dict().items():
        assert torch.equal(tensor, at_two[name]), name


@pytest.mark.parametrize("corrupt", ["__0_0.distcp", "extras.pt"])
def test_inspect_verify_names_the_file_that_fails(tmp_path, corrupt):
    _saved_twice(tmp_path)
    _flip_a_byte(ShardedStore(tmp_path).path_for(4) / corrupt)
    two, four = inventory(tmp_path, verify=True)
    assert two.integrity.endswith("digests ok")
    assert four.integrity.startswith("BAD") and f"{corrupt} does not match" in four.integrity
    assert "not checked (--verify)" in inventory(tmp_path)[1].integrity


def test_a_marker_whose_digests_do_not_cover_every_file_is_refused_while_loading(tmp_path):
    from hpcddp.storage.sharded_reader import VerifyingReader

    _saved_twice(tmp_path)
    path = ShardedStore(tmp_path).path_for(4)
    marker = json.loads((path / "COMPLETE").read_text())
    reader = VerifyingReader(path, {".metadata": marker["digests"][".metadata"]})
    state = {"model": _trained(1).model.state_dict()}
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as failed:
        dcp.load(state, storage_reader=reader, no_dist=True)
    assert isinstance(failed.value.failures[0][0], CheckpointError)
    assert "no digest for __0_0.distcp" in str(failed.value)
