"""Resume reads a checkpoint once per node, and waits for rank 0's writes as long as they take."""

import dataclasses

import pytest
import torch

from hpcddp.comm import waiting
from hpcddp.config import Config, TrainConfig
from hpcddp.launch.resolve import resolve_env
from hpcddp.storage import mapped
from hpcddp.storage.checkpoint import CheckpointStore
from hpcddp.train.checkpointing import Checkpointer, Trained
from hpcddp.train.state import Progress
from tests.fixtures.checkpoints import read


def trained():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return Trained(model, optimizer, scheduler, None)


def saved_at_step_3(tmp_path):
    """(a plain process's environment, the Checkpointer that saved step 3 synchronously)."""
    env = resolve_env({}, cuda_devices=lambda: 0)
    saver = Checkpointer(
        tmp_path, Config(train=TrainConfig(checkpoint_async=False)), env, trained()
    )
    saver.save(Progress(step=3), epoch_done=False)
    return env, saver


@pytest.mark.parametrize("local_rank, reads", [(0, 1), (1, 0)])
def test_only_local_rank_zero_reads_the_file_to_verify_it(tmp_path, monkeypatch, local_rank, reads):
    env, saver = saved_at_step_3(tmp_path)
    verified = []
    real_verify = CheckpointStore.verify
    monkeypatch.setattr(
        CheckpointStore,
        "verify",
        lambda s, p, into=(): verified.append(p) or real_verify(s, p, into),
    )
    here = dataclasses.replace(env, local_rank=local_rank)
    fresh = trained()
    progress = Checkpointer(tmp_path, Config(), here, fresh).resume()
    assert progress is not None and progress.step == 3
    assert len(verified) == reads
    assert torch.equal(fresh.model.weight, saver.trained.model.weight)


def test_a_background_save_is_waited_for_and_then_loads(tmp_path):
    env = resolve_env({}, cuda_devices=lambda: 0)
    state = trained()
    saver = Checkpointer(tmp_path, Config(), env, state)
    saver.save(Progress(step=1), epoch_done=True)
    saver.wait()
    with torch.no_grad():
        state.model.weight.add_(1)  # training moved on after the snapshot
    store = CheckpointStore(tmp_path)
    loaded = read(store, store.path_for(1))
    assert store.latest_step() == 1 and loaded["progress"]["epoch"] == 1
    assert not torch.equal(loaded["model"]["weight"], state.model.weight)


def test_the_wait_for_a_write_grows_with_the_state():
    assert waiting.write_timeout_s(300.0, 0) == 300.0
    assert waiting.write_timeout_s(300.0, 100 * 10**9) == pytest.approx(300.0 + 4000.0)


@pytest.mark.parametrize("local_rank, in_place", [(0, {"weight", "bias"}), (1, set())])
def test_local_rank_zero_reads_the_weights_into_the_model_as_it_verifies(
    tmp_path, monkeypatch, local_rank, in_place
):
    env, saver = saved_at_step_3(tmp_path)
    skipped = []
    real_copy = mapped.copy_into
    monkeypatch.setattr(
        mapped,
        "copy_into",
        lambda d, s, done=(): skipped.append(set(done)) or real_copy(d, s, done),
    )
    fresh = trained()
    here = dataclasses.replace(env, local_rank=local_rank)
    assert Checkpointer(tmp_path, Config(), here, fresh).resume() is not None
    assert skipped == [in_place]  # what the copy left to the verifying read
    assert torch.equal(fresh.model.weight, saver.trained.model.weight)
    assert torch.equal(fresh.model.bias, saver.trained.model.bias)
