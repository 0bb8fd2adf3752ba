"""The trainer: exact resume across stops, rank-0-only outputs, run-directory safety."""

import functools
import json

import pytest
import torch

from hpcddp import Trainer
from hpcddp.config import load_config
from hpcddp.errors import ConfigError
from hpcddp.launch.resolve import resolve_env
from hpcddp.run_files import read_summary
from hpcddp.train.data import default_num_workers
from tests.fixtures.helpers import EXACT, QUICKSTART, TINY, run_cli, summary, train_local


def train_exact(run_dir, *extra, nproc=2):
    """A local run whose every RNG and counter matters (`EXACT`)."""
    return train_local(run_dir, *EXACT, *extra, nproc=nproc)


@pytest.mark.slow
def test_resume_after_stops_is_bitwise_identical(tmp_path):
    """Stop at an epoch boundary and at two mid-epoch points; the final weights do not move.

    Four ranks, not two: with two, the all-reduce's order of addition cannot matter (a + b is
    b + a), which once hid a drift after resume (see Trainer._settle_buckets).
    """
    train_exact(tmp_path / "straight", nproc=4)
    expected = summary(tmp_path / "straight")
    assert expected["steps"] == 24  # 2048 samples / 4 ranks / 32 per batch / 2 accumulated * 3

    resumed = tmp_path / "resumed"
    for stop in (8, 11, 19):  # 8: end of epoch 1; 11 and 19: inside epochs 2 and 3
        train_exact(resumed, f"train.stop_after_steps={stop}", nproc=4)
        assert not (resumed / "summary.json").exists()
    train_exact(resumed, nproc=4)
    got = summary(resumed)
    assert got["weights_sha256"] == expected["weights_sha256"]
    assert got["final_loss"] == expected["final_loss"]
    assert got["eval_accuracy"] == expected["eval_accuracy"]
    steps = [
        json.loads(line)["step"]
        for line in (resumed / "metrics.jsonl").read_text().splitlines()
        if "loss" in json.loads(line)
    ]
    assert steps == sorted(steps) and len(steps) == len(set(steps))  # no duplicated lines


@pytest.mark.slow
def test_only_rank_zero_writes_and_every_rank_logs(tmp_path):
    train_exact(tmp_path, "train.epochs=1")
    names = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    checkpoints = [n for n in names if n.startswith("checkpoints/")]
    diffs = [n for n in names if n.startswith("provenance/")]  # when the tree is dirty
    assert set(names) - set(checkpoints) - set(diffs) == {
        ".lock",  # the run-dir lock: a second run here is refused while this one holds it
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "attempts.jsonl",
        "starts.jsonl",  # the attempt's start, for `hpcddp report`
        "provenance.json",
        "logs/rank-0.log",
        "logs/rank-1.log",
    }
    assert checkpoints == ["checkpoints/step-00000016.pt", "checkpoints/step-00000016.pt.xxh3"]
    assert summary(tmp_path)["hosts"] == [summary(tmp_path)["hosts"][0]] * 2


def test_single_process_fit_in_python_api(tmp_path):
    config = load_config(QUICKSTART, [f"run.dir={tmp_path}", *EXACT, "train.epochs=1"])
    result = Trainer(config=config).fit(resolve_env({})).summary
    assert result.world_size == 1 and result.steps == 32
    assert result == read_summary(tmp_path)
    assert not torch.distributed.is_initialized()  # the group is always torn down


def test_python_api_takes_callables(tmp_path):
    from examples.quickstart import make_dataset, make_model

    config = load_config(QUICKSTART, [f"run.dir={tmp_path}", *EXACT, "train.max_steps=3"])
    result = Trainer(make_model, make_dataset, config).fit(resolve_env({})).summary
    assert result.steps == 3


def test_different_config_is_not_resumed_into(tmp_path):
    config = load_config(QUICKSTART, [f"run.dir={tmp_path}", *EXACT, "train.max_steps=2"])
    Trainer(config=config).fit(resolve_env({}))
    changed = load_config(
        QUICKSTART, [f"run.dir={tmp_path}", *EXACT, "train.max_steps=2", "optim.lr=0.1"]
    )
    with pytest.raises(ConfigError, match=r"different config \(optim.lr: 0.003 -> 0.1\)"):
        Trainer(config=changed).fit(resolve_env({}))
    forced = load_config(
        QUICKSTART,
        [f"run.dir={tmp_path}", *EXACT, "train.max_steps=4", "optim.lr=0.1", "run.force=true"],
    )
    assert Trainer(config=forced).fit(resolve_env({})).summary.steps == 4


def test_resume_at_another_world_size_keeps_the_global_batch(tmp_path):
    """Stopped on 1 rank accumulating 2 micro-batches, resumed on 2 ranks accumulating 1: the
    same global batch, from the step it stopped at (a restart would log steps 1 and 2 again)."""
    common = [f"run.dir={tmp_path}", *EXACT, "train.max_steps=4", "train.log_every_steps=1"]
    first = run_cli("train", QUICKSTART, *common, "train.stop_after_steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert not (tmp_path / "summary.json").exists()
    second = run_cli("train", QUICKSTART, *common, "--nproc", "2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "train.grad_accum_steps 2 -> 1 keeps the global batch of 64 samples" in second.stderr
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "loss" in line] == [1, 2, 3, 4]
    ended = read_summary(tmp_path)
    assert ended is not None and (ended.world_size, ended.steps) == (2, 4)


def test_fp16_trains_on_cpu_with_loss_scaling(tmp_path):
    """fp16 on a CPU rank scales its loss like a GPU one (no longer refused, no silent no-op)."""
    config = load_config(
        QUICKSTART,
        [f"run.dir={tmp_path}", *TINY, "train.precision=fp16", "train.log_every_steps=1"],
    )
    outcome = Trainer(config=config).fit(resolve_env({}))
    assert outcome.finished and outcome.summary.overflow_steps == 0
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["loss_scale"] for line in lines if "loss" in line] == [2.0**16, 2.0**16]


def test_bf16_autocast_trains_on_cpu(tmp_path):
    config = load_config(
        QUICKSTART,
        [
            f"run.dir={tmp_path}",
            *EXACT,
            "train.max_steps=3",
            "train.precision=bf16",
            "optim.grad_clip_norm=1.0",
        ],
    )
    result = Trainer(config=config).fit(resolve_env({})).summary
    assert result.steps == 3 and result.final_loss == result.final_loss  # not NaN


@pytest.mark.parametrize(
    "environ, local_world, workers",
    [
        ({"SLURM_CPUS_PER_TASK": "8"}, 4, 1),  # --nproc 4 inside one task: 2 CPUs each
        ({"SLURM_CPUS_PER_TASK": "1"}, 1, 0),
        ({"SRUN_CPUS_PER_TASK": "3"}, 1, 2),
    ],
)
def test_loader_workers_follow_slurm_cpus(environ, local_world, workers):
    env = resolve_env(
        {"HPCDDP_LOCAL_RANK": "0", "HPCDDP_LOCAL_WORLD_SIZE": str(local_world), **OUR_LAUNCHER},
        cuda_devices=lambda: 0,
        ancestors=lambda: [1],
    )
    assert default_num_workers(env, environ, allowed=set(range(64))) == workers


# A local launcher names itself (its pid) and must be an ancestor of the rank; pid 1 is.
OUR_LAUNCHER = {"HPCDDP_LOCAL_JOB_ID": "1"}
SUBMITIT_LAUNCHER = {"SUBMITIT_LOCAL_JOB_ID": "1"}


def _slurm_step(local_world: int) -> dict:
    """A Slurm step's variables for rank 0 of ``local_world`` tasks on one node."""
    return {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": str(local_world),
        "SLURM_STEP_NODELIST": "n1",
        "SLURM_STEP_TASKS_PER_NODE": str(local_world),
        "SLURM_JOB_ID": "7",
    }


def _torchrun(local_world: int) -> dict:
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(local_world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29500",
    }


@pytest.mark.parametrize(
    "launch, cpus, workers, threads",
    [
        (_slurm_step(4), {"SLURM_CPUS_PER_TASK": "8"}, 7, 8),  # one rank per task: all of it
        (_torchrun(4), {"SLURM_CPUS_PER_TASK": "8"}, 1, 2),  # the node's ranks share one task
        (
            {"HPCDDP_LOCAL_RANK": "0", "HPCDDP_LOCAL_WORLD_SIZE": "2", **OUR_LAUNCHER},
            {"SRUN_CPUS_PER_TASK": "8"},
            3,
            4,
        ),  # hpcddp train --nproc 2 inside an allocation
        (
            {"SUBMITIT_LOCAL_GLOBALID": "0", "SUBMITIT_LOCAL_NTASKS": "4", **SUBMITIT_LAUNCHER},
            {"SLURM_CPUS_PER_TASK": "2"},
            0,
            1,
        ),  # submitit-local: never below one thread
        (_torchrun(4), {"SLURM_CPUS_PER_TASK": "8", "OMP_NUM_THREADS": "3"}, 1, 3),  # OMP wins
    ],
)
def test_ranks_in_one_slurm_task_share_its_cpus(launch, cpus, workers, threads):
    from hpcddp.comm.group import cpu_threads

    env = resolve_env(launch, cuda_devices=lambda: 0, ancestors=lambda: [1])
    assert default_num_workers(env, cpus, allowed=set(range(64))) == workers
    assert cpu_threads(env, cpus) == threads


class NoisyDataset(torch.utils.data.Dataset):
    """Draws from the global RNG in __getitem__, as augmentations do."""

    def __init__(self):
        gen = torch.Generator().manual_seed(3)
        self.x, self.y = (
            torch.randn(256, 16, generator=gen),
            torch.randint(0, 4, (256,), generator=gen),
        )

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(16), self.y[i]


def noisy_data():
    return NoisyDataset()


def test_resume_is_exact_with_a_dataset_that_draws_random_numbers(tmp_path):
    from examples.quickstart import make_model

    common = [*EXACT, "data.kwargs={}", "train.epochs=2"]
    straight = load_config(QUICKSTART, [f"run.dir={tmp_path}/a", *common])
    expected = Trainer(make_model, noisy_data, straight).fit(resolve_env({})).summary
    for stop in ("train.stop_after_steps=5", "train.stop_after_steps=0"):
        config = load_config(QUICKSTART, [f"run.dir={tmp_path}/b", *common, stop])
        got = Trainer(make_model, noisy_data, config).fit(resolve_env({})).summary
    assert got.weights_sha256 == expected.weights_sha256


def test_max_steps_beyond_one_epoch_runs_them_all(tmp_path):
    config = load_config(
        QUICKSTART, [f"run.dir={tmp_path}", *EXACT, "train.epochs=1", "train.max_steps=70"]
    )  # 32 steps per epoch here
    result = Trainer(config=config).fit(resolve_env({})).summary
    assert result.steps == 70 and result.epochs == 3


class CompileWitness(torch.nn.Module):
    """The quickstart MLP, noting whether its forward was ever traced by torch.compile."""

    traced = False

    def __init__(self, **kwargs):
        super().__init__()
        from examples.quickstart import make_model

        self.inner = make_model(**kwargs)

    def forward(self, inputs):
        if torch.compiler.is_compiling():
            CompileWitness.traced = True
        return self.inner(inputs)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_torch_compile_trains_the_compiled_model(tmp_path, monkeypatch, strategy):
    from examples.quickstart import make_dataset

    # dynamo traces the model as it would for inductor; inductor's C++ code generation (half a
    # minute of both cores here) is torch's to test, not ours
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    monkeypatch.setattr(CompileWitness, "traced", False)

    # under fsdp the MLP's Linear layers are its blocks, compiled after they are sharded
    sharded = ["dist.strategy=fsdp", "dist.fsdp_blocks=[Linear]"] if strategy == "fsdp" else []
    config = load_config(
        QUICKSTART,
        [f"run.dir={tmp_path}", *EXACT, "train.max_steps=3", "train.compile=true", *sharded],
    )
    result = Trainer(CompileWitness, make_dataset, config).fit(resolve_env({})).summary
    assert result.steps == 3 and result.final_loss < 2
    assert CompileWitness.traced
    keys = _checkpointed_model_keys(tmp_path / "checkpoints")
    assert keys and all(not k.startswith("_orig_mod") for k in keys)  # checkpoints stay portable


def _checkpointed_model_keys(folder) -> list[str]:
    """The model's parameter names in the run's checkpoint: a whole one's (ddp, ``.pt``) or a
    sharded one's (fsdp, ``.dcp``: the names in DCP's metadata, less the ``model.`` prefix)."""
    from torch.distributed import checkpoint as dcp

    whole = list(folder.glob("*.pt"))
    if whole:
        return list(torch.load(whole[0], weights_only=True)["model"])
    (sharded,) = folder.glob("*.dcp")
    names = dcp.FileSystemReader(str(sharded)).read_metadata().state_dict_metadata
    return [k.removeprefix("model.") for k in names if k.startswith("model.")]
