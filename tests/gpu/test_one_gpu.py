"""What one GPU can prove: a world of one on NCCL in each precision (each proving its precision
took effect), fp16's loss scaling on a model that overflows, a dataset held on the GPU,
`hpcddp check` on NCCL, the flight recorder's real dump format, and two gloo ranks sharing the
GPU (DDP on CUDA tensors, a background checkpoint from pinned memory, bitwise resume)."""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from hpcddp.records import nccl_blame
from tests.fixtures.helpers import EXACT, QUICK, QUICKSTART, REPO, run_cli, summary, train_local

# run-split's tiny transformer whose first fp16 backwards overflow at GradScaler's 2^16
FP16_OVERFLOW = "tests/fixtures/fp16_transformer.yaml"
# torch 2.9 to 2.11's warning for the legacy TF32 settings, which hpcddp keeps off the console
TF32_WARNING = "Please use the new API settings to control TF32 behavior"
PROBE = "model.factory=tests.fixtures.precision_probe:make_model"
BUS_ID = r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.0"


def metrics(run_dir: pathlib.Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line]


@pytest.mark.parametrize(
    "precision, autocast, output",
    [
        ("fp32", False, "torch.float32"),
        ("bf16", True, "torch.bfloat16"),
        ("fp16", True, "torch.float16"),
    ],
)
def test_a_world_of_one_trains_on_nccl_in_each_precision(tmp_path, precision, autocast, output):
    seen = tmp_path / "seen.json"
    done = train_local(
        tmp_path / "run",
        *QUICK,
        f"train.precision={precision}",
        PROBE,
        f"model.kwargs={{seen: {seen}}}",
        nproc=1,
    )
    got = summary(tmp_path / "run")
    assert got["steps"] > 0 and got["final_loss"] == got["final_loss"]  # finite, not NaN
    log = (tmp_path / "run" / "logs" / "rank-0.log").read_text()
    assert "device cuda:0, backend nccl" in log, done.stderr[-2000:]
    probe = json.loads(seen.read_text())  # what the model itself ran in
    assert probe["device"] == "cuda:0" and probe["autocast"] is autocast, probe
    assert probe["output_dtype"] == output, probe
    if autocast:
        assert probe["autocast_dtype"] == output, probe
    peaks = [line["cuda_gb_max"] for line in metrics(tmp_path / "run") if "cuda_gb_max" in line]
    assert peaks and all(peak > 0 for peak in peaks)  # each interval's own peak
    assert TF32_WARNING not in done.stderr


def test_fp16_scales_the_loss_down_when_the_transformer_overflows(tmp_path):
    train_local(tmp_path, config=FP16_OVERFLOW, nproc=1)
    got = summary(tmp_path)
    assert got["overflow_steps"] >= 1 and got["final_loss"] == got["final_loss"]
    scales = [line["loss_scale"] for line in metrics(tmp_path) if "loss_scale" in line]
    assert scales and min(scales) < 2.0**16, scales  # GradScaler backed off from its start


def test_a_dataset_held_on_the_gpu_trains_without_pinning_or_workers(tmp_path):
    done = train_local(
        tmp_path,
        *QUICK,
        "data.factory=tests.fixtures.cuda_dataset:make_dataset",
        "data.num_workers=-1",  # the default: a worker per spare CPU, for host data
        nproc=1,
    )
    assert summary(tmp_path)["steps"] > 0, done.stderr[-2000:]
    log = (tmp_path / "logs" / "rank-0.log").read_text()
    assert "the dataset's samples are already on cuda:0: no pinned memory" in log


def test_check_shows_the_nccl_rows_and_the_gpu_s_bus_id(tmp_path):
    done = run_cli("check", QUICKSTART, f"run.dir={tmp_path}", "--nproc", "1", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "all-reduce (nccl, 1 ranks)" in done.stdout, done.stdout
    assert re.search(rf"cuda:0 (GPU|MIG)-[0-9a-f]{{8}} {BUS_ID}", done.stdout), done.stdout
    assert "4096x4096 matmul" in done.stdout  # the GPU probe, timed with CUDA events
    assert "the job should train" in done.stdout or "the job would train" in done.stdout


# A world of one on NCCL runs three all-reduces, then takes the flight recorder's dump as torch
# writes it on a timeout; hpcddp's reader must find the default group and its last collective.
DUMP_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch, torch.distributed as dist
    import torch._C._distributed_c10d as c10d
    from hpcddp.records import nccl_blame
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    for _ in range(3):
        dist.all_reduce(torch.ones(4, device="cuda"))
    torch.cuda.synchronize()
    dump = getattr(c10d, "_dump_nccl_trace", None) or c10d._dump_fr_trace
    data = dump()
    open(sys.argv[1], "wb").write(data)
    print(nccl_blame.parse(0, data))
    dist.destroy_process_group()
    """
)


def test_the_flight_recorder_s_real_dump_is_read_by_the_blame_rule(tmp_path):
    script, dump = tmp_path / "dump.py", tmp_path / "nccl-trace-rank-0"
    script.write_text(DUMP_SCRIPT)
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script), str(dump)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = nccl_blame.parse(0, dump.read_bytes())
    assert parsed == nccl_blame.Dump(0, (0,), 3), (parsed, done.stdout)


# -- two gloo ranks sharing the one GPU -------------------------------------------------------

GLOO_ON_ONE_GPU = ["dist.backend=gloo"]  # NCCL refuses two ranks on one GPU; gloo does not


def test_two_gloo_ranks_share_the_gpu_and_resume_a_pinned_background_checkpoint_bitwise(
    tmp_path,
):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    options = [*EXACT, *GLOO_ON_ONE_GPU, "train.checkpoint_async=true"]
    done = train_local(straight, *options)
    for rank in (0, 1):  # DDP on CUDA tensors, both ranks on the one GPU
        log = (straight / "logs" / f"rank-{rank}.log").read_text()
        assert "device cuda:0, backend gloo" in log, done.stderr[-2000:]
    train_local(resumed, *options, "train.stop_after_steps=7")
    saved = re.findall(
        r"([\d.]+) MB copied to host memory in [\d.]+ s \(([\d.]+) MB pinned\)",
        (resumed / "logs" / "rank-0.log").read_text(),
    )
    assert saved, "no background save was logged"
    state_mb, pinned_mb = map(float, saved[-1])
    assert 0 < state_mb <= pinned_mb <= 1.1 * state_mb + 0.1  # pinned, at the state's own size
    train_local(resumed, *options)
    assert summary(resumed)["weights_sha256"] == summary(straight)["weights_sha256"]
