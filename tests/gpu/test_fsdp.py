"""dist.strategy=fsdp on real GPUs and NCCL: on one GPU a world of one shards (bf16 gathered,
fp32 reduced, fp32 shards), recomputes activations, offloads its shards to host memory, scales
fp16 losses over sharded gradients, resumes its sharded checkpoint bitwise, and `hpcddp check`
weighs the sharded model against the GPU's memory; on two GPUs, two NCCL ranks each hold half
and reduce-scatter in fp32, resume bitwise, and skip a step that overflowed in one rank's shard.

Each row reads what FSDP really did from `tests.fixtures.fsdp_probe` (the sharded test
transformer, noting dtypes and devices as it trains) or from the run's own records, never
only that the run finished."""

import json
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from tests.fixtures.helpers import EXACT, run_cli, summary, train_local
from tests.fixtures.sharded_transformer import Block

SHARDED = "tests/fixtures/sharded_transformer.yaml"  # 3 blocks: fsdp's units
LAYERS = 3
FP16_OVERFLOW = "tests/fixtures/fp16_transformer.yaml"
# 6 steps of one micro-batch each (each training forward then sees the shards at rest)
SHORT = ["train.grad_accum_steps=1", "train.max_steps=6", "train.checkpoint_every_steps=0"]
# the quickstart MLP, its Linear layers sharded one by one: its GPU kernels repeat bitwise
EXACT_FSDP = [*EXACT, "dist.strategy=fsdp", "dist.fsdp_blocks=[Linear]", "train.precision=bf16"]


def probed(seen: pathlib.Path, *extra: str) -> list[str]:
    """Overrides training the sharded transformer through the probe, which writes to ``seen``."""
    seen.mkdir(parents=True, exist_ok=True)
    probe = ["model.factory=tests.fixtures.fsdp_probe:make_model", f"model.kwargs={{seen: {seen}}}"]
    return [*probe, *SHORT, *extra]


def seen_by(seen: pathlib.Path, rank: int = 0) -> dict:
    return json.loads((seen / f"rank-{rank}.json").read_text())


def losses(run_dir: pathlib.Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line]
    return {r["step"]: r["loss"] for r in records if "loss" in r and "step" in r}


def where(devices: list[str], dtype: str) -> dict:
    """A probe record: every tensor's local part on ``devices``, in ``dtype``, sharded."""
    return {"devices": devices, "dtypes": [dtype], "sharded": True}


@pytest.fixture(scope="module")
def bf16_one_gpu(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path, str]:
    """The sharded transformer on cuda:0, a world of one on NCCL, bf16: its run, its probe."""
    root = tmp_path_factory.mktemp("fsdp-bf16")
    done = train_local(
        root / "run", *probed(root / "seen", "train.precision=bf16"), config=SHARDED, nproc=1
    )
    return root / "run", root / "seen", done.stderr


# -- one GPU ----------------------------------------------------------------------------------


def test_a_world_of_one_shards_on_nccl_gathering_bf16_and_reducing_fp32(bf16_one_gpu):
    run, seen, stderr = bf16_one_gpu
    log = (run / "logs" / "rank-0.log").read_text()
    assert "device cuda:0, backend nccl" in log, stderr[-2000:]
    assert f"fsdp: {LAYERS} blocks sharded over 1 ranks" in stderr
    probe = seen_by(seen)
    assert probe["inputs"] == "cuda:0"
    # while a block computes: its parameters gathered whole, in bf16, on the GPU
    assert probe["gathered"] == {"dtype": "torch.bfloat16", "device": "cuda:0", "sharded": False}
    # between steps: the fp32 master shards on the GPU, stepped on by fp32 gradients and moments
    assert probe["shards"] == where(["cuda:0"], "torch.float32"), probe
    assert probe["grads"] == where(["cuda:0"], "torch.float32"), probe
    assert probe["optimizer_state"] == where(["cuda:0"], "torch.float32"), probe
    assert probe["reduce_dtypes"] == ["torch.float32"], probe  # FSDP's policy per parameter
    assert probe["block_calls"][-1] == LAYERS  # each block once a micro-batch: no recompute
    assert summary(run)["steps"] == 6 and summary(run)["final_loss"] == summary(run)["final_loss"]


def test_activation_checkpointing_recomputes_each_block_on_the_gpu(bf16_one_gpu, tmp_path):
    plain, _, _ = bf16_one_gpu
    done = train_local(
        tmp_path / "run",
        *probed(
            tmp_path / "seen", "train.precision=bf16", "dist.fsdp_activation_checkpointing=true"
        ),
        config=SHARDED,
        nproc=1,
    )
    assert "activations recomputed per block" in done.stderr
    probe = seen_by(tmp_path / "seen")
    # every micro-batch after the first ran each block's forward twice: once more in backward
    assert probe["block_calls"][2:] == [2 * LAYERS] * len(probe["block_calls"][2:]), probe
    assert len(probe["block_calls"]) >= 5
    # the same arithmetic, recomputed: the losses of the run without it
    assert losses(tmp_path / "run") == pytest.approx(losses(plain), rel=1e-3, abs=1e-4)


def test_cpu_offload_trains_with_shards_gradients_and_moments_in_host_memory(
    bf16_one_gpu, tmp_path
):
    plain, _, _ = bf16_one_gpu
    done = train_local(
        tmp_path / "run",
        *probed(tmp_path / "seen", "train.precision=bf16", "dist.fsdp_cpu_offload=true"),
        config=SHARDED,
        nproc=1,
    )
    assert "shards offloaded to host memory" in done.stderr
    probe = seen_by(tmp_path / "seen")
    # at rest the shards, their gradients and AdamW's moments live in host memory ...
    assert probe["shards"] == where(["cpu"], "torch.float32"), probe
    assert probe["grads"] == where(["cpu"], "torch.float32"), probe
    assert probe["optimizer_state"] == where(["cpu"], "torch.float32"), probe
    # ... and each block is copied to the GPU, gathered in bf16, for its own compute
    assert probe["gathered"] == {"dtype": "torch.bfloat16", "device": "cuda:0", "sharded": False}
    assert probe["inputs"] == "cuda:0"
    # it trains: the run on the GPU's own losses, the optimizer stepping on the CPU instead
    assert summary(tmp_path / "run")["steps"] == 6
    assert losses(tmp_path / "run") == pytest.approx(losses(plain), rel=0.05)


def test_fp16_loss_scaling_skips_a_step_whose_sharded_gradient_overflowed(tmp_path):
    # the fixture's first scaled backwards overflow; at step 9 one gradient element is inf
    train_local(
        tmp_path,
        "dist.strategy=fsdp",
        "model.kwargs={inf_grad_at_call: 9}",
        config=FP16_OVERFLOW,
        nproc=1,
    )
    record = summary(tmp_path)
    assert (record["status"], record["steps"]) == ("finished", 12)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    scales = {line["step"]: line["loss_scale"] for line in lines if "loss" in line}
    assert scales[1] < 2.0**16, scales  # the first steps overflowed and were skipped
    assert scales[9] == scales[8] / 2 and record["overflow_steps"] >= 2, scales


def test_a_sharded_checkpoint_saved_from_the_gpu_resumes_bitwise(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    options = [*EXACT_FSDP, "train.checkpoint_async=true"]
    train_local(straight, *options, nproc=1)
    train_local(resumed, *options, "train.stop_after_steps=7", nproc=1)
    assert "step-00000007.dcp" in {p.name for p in (resumed / "checkpoints").iterdir()}
    train_local(resumed, *options, nproc=1)
    log = (resumed / "logs" / "rank-0.log").read_text()
    assert "resumed from step 7 (step-00000007.dcp)" in log
    assert "device cuda:0, backend nccl" in log
    assert summary(resumed)["weights_sha256"] == summary(straight)["weights_sha256"]


def gpu_memory_bytes() -> tuple[int, int]:
    """cuda:0's free and total memory (what `hpcddp check` weighs a rank's state against is
    the free), read in a process of its own: a CUDA context held by pytest would take room
    from every later row's ranks."""
    asked = "import torch; print(*torch.cuda.mem_get_info(0))"
    done = subprocess.run(
        [sys.executable, "-c", asked], capture_output=True, text=True, timeout=120
    )
    free, total = map(int, done.stdout.split())
    return free, total


def layers_for(state_bytes: float, width: int) -> int:
    """Blocks of the sharded transformer at ``width`` whose AdamW state (16 bytes a parameter)
    comes to about ``state_bytes``."""
    with torch.device("meta"):
        block = sum(p.numel() for p in Block(width, 32).parameters())
    return max(1, round(state_bytes / (16 * block)))


def test_check_weighs_the_sharded_model_against_the_gpu_s_memory(tmp_path):
    room, total = gpu_memory_bytes()
    # state 1.25x the GPU's free memory: too big for it even sharded at one rank; where the
    # node's RAM is larger, a check that weighed it against RAM would say it fits (and the
    # room it states is compared with the GPU's below either way)
    layers = layers_for(1.25 * room, 4096)
    size = f"model.kwargs={{width: 4096, heads: 32, layers: {layers}}}"
    done = run_cli("check", SHARDED, f"run.dir={tmp_path}", size, "--nproc", "1", timeout=300)
    line = next((x for x in done.stdout.splitlines() if "model state per rank" in x), "")
    assert "at 1 ranks" in line and "dist.strategy=fsdp does not fit even sharded" in line, (
        done.stdout + done.stderr[-2000:]
    )
    found = re.search(r"has ([\d.]+) (GB|MB) GPU per rank", line)
    assert found, line
    stated = float(found[1]) * 2 ** (30 if found[2] == "GB" else 20)
    assert 0.9 * room <= stated <= 1.02 * total
    assert done.returncode != 0  # the job would not train: an error, not a warning


# -- two GPUs ---------------------------------------------------------------------------------


@pytest.mark.gpus(2)
def test_two_nccl_ranks_each_hold_half_and_reduce_scatter_in_fp32(tmp_path):
    done = train_local(
        tmp_path / "run", *probed(tmp_path / "seen", "train.precision=bf16"), config=SHARDED
    )
    assert f"fsdp: {LAYERS} blocks sharded over 2 ranks" in done.stderr
    probes = [seen_by(tmp_path / "seen", rank) for rank in (0, 1)]
    for rank, probe in enumerate(probes):
        log = (tmp_path / "run" / "logs" / f"rank-{rank}.log").read_text()
        assert f"device cuda:{rank}, backend nccl" in log
        assert probe["shards"] == where([f"cuda:{rank}"], "torch.float32"), probe
        gathered = {"dtype": "torch.bfloat16", "device": f"cuda:{rank}", "sharded": False}
        assert probe["gathered"] == gathered, probe
        # the gradients left each GPU in fp32 through NCCL's reduce-scatter
        assert probe["reduce_scatter_dtypes"] == ["torch.float32"], probe
    whole = probes[0]["numel"]["whole"]
    assert all(p["numel"]["local"] < whole for p in probes)
    assert sum(p["numel"]["local"] for p in probes) == whole


@pytest.mark.gpus(2)
def test_cpu_offload_on_two_gpus_combines_the_gradient_norm_on_the_gpus(tmp_path):
    """NCCL has no CPU collectives: the norm of the gradients held in host memory is combined
    on the GPUs (`norm_through_mesh_device`), and clipping by it trains."""
    offloaded = ("train.precision=bf16", "dist.fsdp_cpu_offload=true", "optim.grad_clip_norm=0.5")
    done = train_local(tmp_path / "run", *probed(tmp_path / "seen", *offloaded), config=SHARDED)
    assert "shards offloaded to host memory" in done.stderr
    for rank in (0, 1):
        assert seen_by(tmp_path / "seen", rank)["grads"] == where(["cpu"], "torch.float32")
    assert summary(tmp_path / "run")["steps"] == 6


@pytest.mark.gpus(2)
def test_two_gpus_resume_their_sharded_checkpoint_bitwise(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_local(straight, *EXACT_FSDP)
    train_local(resumed, *EXACT_FSDP, "train.stop_after_steps=7")
    train_local(resumed, *EXACT_FSDP)
    log = (resumed / "logs" / "rank-1.log").read_text()
    assert "device cuda:1, backend nccl" in log
    assert (
        "resumed from step 7 (step-00000007.dcp)" in (resumed / "logs" / "rank-0.log").read_text()
    )
    assert summary(resumed)["weights_sha256"] == summary(straight)["weights_sha256"]


@pytest.mark.gpus(2)
def test_an_overflow_in_one_gpu_s_shard_skips_the_step_on_both(tmp_path):
    # at step 9 one gradient element is inf, in rank 1's shard only; rank 0's scale (the one
    # logged) must halve there too: NCCL carried the found-inf flag
    poisoned = ["dist.strategy=fsdp", "model.kwargs={inf_grad_at_call: 9}"]
    train_local(tmp_path, *poisoned, config=FP16_OVERFLOW)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    scales = {line["step"]: line["loss_scale"] for line in lines if "loss" in line}
    assert scales[9] == scales[8] / 2 and summary(tmp_path)["overflow_steps"] >= 2, scales
