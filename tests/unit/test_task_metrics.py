"""Evaluation metrics: built-ins per task kind, and sums and counts that reduce exactly."""

import math

import pytest
import torch

from hpcddp.config import TaskConfig
from hpcddp.launch.resolve import resolve_env
from hpcddp.train import task_metrics
from hpcddp.train.data import EvalShard
from hpcddp.train.task import Task
from tests.unit.test_batches import Plain


def evaluate_like_ranks(task, inputs, targets, world, batch_size):
    """What each of ``world`` ranks totals over its EvalShard, merged as the trainer does."""
    dataset = torch.utils.data.TensorDataset(inputs, targets)
    per_rank = []
    for rank in range(world):
        env = resolve_env(
            {"HPCDDP_LOCAL_RANK": str(rank), "HPCDDP_LOCAL_WORLD_SIZE": str(world),
             "HPCDDP_LOCAL_JOB_ID": "77", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"},
            cuda_devices=lambda: 0,
            ancestors=lambda: [77],  # as if started by local launcher 77
        )  # fmt: skip
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=EvalShard(dataset, env)
        )
        totals: dict = {}
        for x, y in loader:
            task_metrics.add(totals, task_metrics.score(task, x, (x, y), y))
        per_rank.append(task_metrics.as_floats(totals))
    return task_metrics.finish(task_metrics.merge(per_rank), task.kind)


def test_regression_reports_mse_and_mae_not_accuracy():
    task = Task.resolve(TaskConfig(kind="regression"), Plain())
    predicted, targets = torch.tensor([[1.0], [2.0], [4.0]]), torch.tensor([1.0, 0.0, 1.0])
    result = evaluate_like_ranks(task, predicted, targets, world=1, batch_size=2)
    assert result == pytest.approx({"eval_loss": 13 / 3, "eval_mse": 13 / 3, "eval_mae": 5 / 3})


@pytest.mark.parametrize("world, batch_size", [(1, 4), (2, 3), (3, 2), (4, 5)])
def test_uneven_shards_reduce_to_the_single_process_figures(world, batch_size):
    """11 samples: shards of 4/4/3, 3/3/3/2..., short last batches; every sample counted once."""
    gen = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(11, 5, generator=gen), torch.randint(0, 5, (11,), generator=gen)
    task = Task.resolve(TaskConfig(), Plain())
    result = evaluate_like_ranks(task, logits, labels, world, batch_size)
    expected_loss = torch.nn.functional.cross_entropy(logits.double(), labels).item()
    expected_accuracy = (logits.argmax(-1) == labels).double().mean().item()
    assert result["eval_loss"] == pytest.approx(expected_loss, rel=1e-6)
    assert result["eval_accuracy"] == expected_accuracy


def test_an_average_of_averages_would_differ():
    """Why sums and counts: a rank with 1 sample must not weigh as much as one with 10."""
    per_rank = [{"loss": [10 * 1.0, 10]}, {"loss": [1 * 5.0, 1]}]
    merged = task_metrics.merge(per_rank)
    assert task_metrics.finish(merged, "classification") == {"eval_loss": 15 / 11}
    assert task_metrics.merge([{}, *per_rank]) == merged  # an empty shard adds nothing


def test_language_modelling_weighs_tokens_and_reports_perplexity():
    task = Task.resolve(TaskConfig(kind="language_modeling"), Plain())
    logits = torch.zeros(2, 4, 8)  # uniform: loss ln 8 per token
    targets = torch.tensor([[1, 2, 3, -100], [4, -100, -100, -100]])
    scores = task_metrics.score(task, logits, (logits, targets), targets)
    assert float(scores["loss"][1]) == 4  # four real tokens, padding left out
    totals = task_metrics.as_floats({k: list(v) for k, v in scores.items()})
    result = task_metrics.finish(totals, "language_modeling")
    assert result["eval_loss"] == pytest.approx(math.log(8))
    assert result["eval_perplexity"] == pytest.approx(8)
    assert "eval_accuracy" not in result


def test_an_hf_causal_lm_loss_is_weighed_by_its_shifted_labels():
    transformers = pytest.importorskip("transformers")
    task = Task.resolve(TaskConfig(kind="language_modeling"), Plain())
    labels = torch.tensor([[1, 2, 3, -100]])
    output = transformers.modeling_outputs.CausalLMOutput(
        loss=torch.tensor(2.0), logits=torch.zeros(1, 4, 8)
    )
    scores = task_metrics.score(task, output, {"input_ids": labels, "labels": labels}, labels)
    assert float(scores["loss"][1]) == 2  # labels[..., 1:]: tokens 2 and 3
    assert float(scores["loss"][0]) == 4.0


def test_a_self_scoring_output_without_targets_reports_its_loss():
    task = Task.resolve(TaskConfig(), Plain())
    scores = task_metrics.score(task, {"loss": torch.tensor(0.25)}, {"x": 1}, None)
    floats = task_metrics.as_floats({k: list(v) for k, v in scores.items()})
    assert task_metrics.finish(floats, "x") == {"eval_loss": 0.25}
