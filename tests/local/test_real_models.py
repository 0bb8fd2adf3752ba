"""Real models end to end: tuple, dict and ModelOutput outputs, dict batches, the NaN guard."""

import json
import time

import pytest
import torch
from torch import nn

from hpcddp import Trainer
from hpcddp.config import load_config
from hpcddp.errors import ConfigError
from hpcddp.launch.resolve import resolve_env
from hpcddp.storage.checkpoint import CheckpointStore
from tests.fixtures.helpers import QUICK, QUICKSTART, TINY, run_cli
from tests.fixtures.webhook import Receiver


class Shaped(nn.Module):
    """The quickstart MLP returning its logits as a tuple, a dict or an HF ModelOutput."""

    def __init__(self, shape: str) -> None:
        super().__init__()
        from examples.quickstart import make_model

        self.inner, self.shape = make_model(), shape

    def forward(self, x=None, features=None, labels=None):
        logits = self.inner(x if x is not None else features)
        if self.shape == "tuple":
            return logits, logits.detach().norm()
        if self.shape == "dict":
            return {"hidden": torch.zeros(1), "logits": logits}
        from transformers.modeling_outputs import SequenceClassifierOutput

        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class AsDicts(torch.utils.data.Dataset):
    def __init__(self, pairs):
        self.pairs = pairs

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        x, y = self.pairs[i]
        return {"features": x, "labels": y}


def pairs():
    from examples.quickstart import make_dataset

    return make_dataset(train_size=512, eval_size=128)


def dicts():
    train, evaluation = pairs()
    return AsDicts(train), AsDicts(evaluation)


@pytest.mark.parametrize(
    "shape, dataset",
    [("tuple", pairs), ("dict", pairs), ("output", pairs), ("dict", dicts), ("output", dicts)],
    ids=["tuple-out", "dict-out", "modeloutput", "dict-batches", "dict-batches-modeloutput"],
)
def test_outputs_and_batches_of_every_shape_train_and_evaluate(tmp_path, shape, dataset):
    config = load_config(QUICKSTART, [f"run.dir={tmp_path}", "data.kwargs={}", "train.epochs=4"])
    result = Trainer(lambda **kw: Shaped(shape), dataset, config).fit(resolve_env({})).summary
    assert result.steps == 32 and result.evaluation["eval_accuracy"] > 0.6
    assert result.evaluation["eval_loss"] < 1.0 and result.final_loss < 1.0


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def forward(self, x):
        return self.net(x)


def regression_data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(384, 4, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    return torch.utils.data.TensorDataset(x[:256], y[:256]), torch.utils.data.TensorDataset(
        x[256:], y[256:]
    )


def test_a_regression_model_reports_mse_and_mae(tmp_path):
    config = load_config(
        QUICKSTART,
        [
            f"run.dir={tmp_path}",
            "data.kwargs={}",
            "model.kwargs={}",
            "task.kind=regression",
            "train.epochs=10",
            "optim.lr=0.1",
            "optim.warmup_steps=0",
            "optim.schedule=constant",
        ],
    )
    result = Trainer(Regressor, regression_data, config).fit(resolve_env({})).summary
    metrics = result.evaluation
    assert "eval_accuracy" not in metrics
    assert metrics["eval_mse"] == pytest.approx(metrics["eval_loss"]) and metrics["eval_mse"] < 1.0
    assert 0 < metrics["eval_mae"] < 1.0


def empty_eval():
    train, _ = pairs()
    return train, torch.utils.data.TensorDataset(torch.zeros(0, 16), torch.zeros(0))


def test_an_empty_eval_set_is_refused_at_start_up(tmp_path):
    from examples.quickstart import make_model

    config = load_config(QUICKSTART, [f"run.dir={tmp_path}", "data.kwargs={}"])
    with pytest.raises(ConfigError, match=r"eval set .* is empty.*HINT"):
        Trainer(make_model, empty_eval, config).fit(resolve_env({}))
    assert not list(tmp_path.glob("checkpoints/*.pt"))


NAN_AT_8_ON_RANK_1 = [
    *QUICK,
    "model.factory=tests.fixtures.faulty_model:make_model",
    "model.kwargs={rank: 1, at_call: 8, mode: nan}",
    "train.checkpoint_every_steps=3",
    "train.log_every_steps=1",
]


def test_nan_at_step_8_on_rank_1_stops_every_rank_there_keeping_step_6(tmp_path):
    with Receiver() as receiver:
        result = run_cli(
            "train", QUICKSTART, f"run.dir={tmp_path}", *NAN_AT_8_ON_RANK_1,
            f"notify.url={receiver.url}", "--nproc", "2",
        )  # fmt: skip
        receiver.wait_for(2)
        time.sleep(0.3)  # a duplicate, or a "failed" as well, would have arrived by now
    assert result.returncode == 1, result.stderr[-3000:]
    # told once, by rank 0, as "nan" (not "failed"), with the one line every rank printed
    nan = receiver.bodies[-1]
    assert [(b["event"], b["step"]) for b in receiver.bodies] == [("started", 0), ("nan", 8)]
    assert "at step 8 in the loss first on rank 1;" in nan["text"], nan["text"]
    lines = [line for line in result.stderr.splitlines() if "non-finite" in line]
    assert len(lines) == 1, result.stderr[-3000:]  # both ranks raised the same: printed once
    assert "at step 8 in the loss first on rank 1;" in lines[0]
    assert "checkpoint step 6 is the latest" in lines[0]
    assert CheckpointStore(tmp_path).latest_step() == 6
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line).get("step") for line in lines]
    assert max(steps) == 7  # step 8 was not applied, logged or saved
    record = json.loads((tmp_path / "summary.json").read_text())
    assert record["reason"] == "nonfinite" and record["status"] == "failed"
    assert (record["steps"], record["first_rank"]) == (8, 1)


def test_skip_policy_skips_the_nan_step_and_counts_it(tmp_path):
    result = run_cli(
        "train", QUICKSTART, f"run.dir={tmp_path}", *NAN_AT_8_ON_RANK_1,
        "train.nonfinite=skip", "--nproc", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    done = json.loads((tmp_path / "summary.json").read_text())
    assert done["skipped_steps"] == 1 and done["steps"] == 32
    assert done["final_loss"] == done["final_loss"]  # not NaN: the bad step never applied


def test_skip_policy_stops_after_too_many(tmp_path):
    result = run_cli(
        "train", QUICKSTART, f"run.dir={tmp_path}", *TINY, *NAN_AT_8_ON_RANK_1[1:],
        "model.kwargs={rank: 0, at_call: 1, mode: nan}", "train.nonfinite=skip",
        "train.nonfinite_max_skips=0",
    )  # fmt: skip
    assert result.returncode == 1
    assert "at step 1 in the loss first on rank 0, after 1 skipped steps" in result.stderr
