"""2 ranks with NCCL on one GPU node: the quickstart in each precision, a background checkpoint
from pinned memory resumed bitwise, `hpcddp check`'s NCCL rows, and a hung NCCL collective."""

import json
import pathlib
import pickle
import re

import pytest

from tests.fixtures.helpers import EXACT, QUICK, QUICKSTART, run_cli, summary, train_local

# run-split's tiny transformer whose first fp16 backwards overflow at GradScaler's 2^16
FP16_OVERFLOW = "tests/fixtures/fp16_transformer.yaml"


def metrics(run_dir: pathlib.Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_the_quickstart_trains_on_nccl_in_each_precision(tmp_path, precision):
    done = train_local(tmp_path, *QUICK, f"train.precision={precision}")
    got = summary(tmp_path)
    assert got["steps"] > 0 and got["final_loss"] == got["final_loss"]  # finite, not NaN
    log = (tmp_path / "logs" / "rank-1.log").read_text()
    assert "device cuda:1, backend nccl" in log, done.stderr[-2000:]
    peaks = [line["cuda_gb_max"] for line in metrics(tmp_path) if "cuda_gb_max" in line]
    assert peaks and all(peak > 0 for peak in peaks)  # each interval's own peak


def test_fp16_survives_the_overflowing_transformer(tmp_path):
    train_local(tmp_path, config=FP16_OVERFLOW)
    got = summary(tmp_path)
    assert got["overflow_steps"] >= 1 and got["final_loss"] == got["final_loss"]
    assert any("loss_scale" in line for line in metrics(tmp_path))


def test_a_background_checkpoint_from_pinned_memory_resumes_bitwise(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_local(straight, *EXACT, "train.checkpoint_async=true")
    train_local(resumed, *EXACT, "train.checkpoint_async=true", "train.stop_after_steps=7")
    saved = re.findall(
        r"([\d.]+) MB copied to host memory in [\d.]+ s \(([\d.]+) MB pinned\)",
        (resumed / "logs" / "rank-0.log").read_text(),
    )
    assert saved, "no background save was logged"
    state_mb, pinned_mb = map(float, saved[-1])
    assert state_mb <= pinned_mb <= 1.1 * state_mb + 0.1  # pinned at the state's own size
    train_local(resumed, *EXACT, "train.checkpoint_async=true")
    assert summary(resumed)["weights_sha256"] == summary(straight)["weights_sha256"]


def test_check_shows_the_nccl_rows(tmp_path):
    done = run_cli("check", QUICKSTART, f"run.dir={tmp_path}", "--nproc", "2", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "all-reduce (nccl, 2 ranks)" in done.stdout, done.stdout
    assert "4096x4096 matmul" in done.stdout  # the GPU probe, timed with CUDA events
    assert "the job should train" in done.stdout or "the job would train" in done.stdout


def last_collective(dump: pathlib.Path) -> int:
    """The highest collective sequence number a rank's flight recorder dump holds."""
    entries = pickle.loads(dump.read_bytes()).get("entries", [])
    return max((entry.get("collective_seq_id", 0) for entry in entries), default=0)


def test_a_hung_nccl_collective_leaves_a_flight_recorder_dump_that_names_the_rank(tmp_path):
    done = run_cli(
        "train",
        QUICKSTART,
        f"run.dir={tmp_path}",
        *QUICK,
        "model.factory=tests.fixtures.faulty_model:make_model",
        "model.kwargs={rank: 1, at_call: 3, mode: hang}",  # rank 1 never reaches step 3's
        "dist.timeout_s=20",  # all-reduce; NCCL's watchdog ends rank 0 after 20 s
        "--nproc",
        "2",
        timeout=300,
    )
    assert done.returncode != 0 and done.returncode != 2, done.stderr[-3000:]
    logs = tmp_path / "logs"
    dumps = {int(p.name.rsplit("-", 1)[1]): p for p in logs.glob("nccl-trace-rank-*")}
    assert 0 in dumps, sorted(p.name for p in logs.iterdir())  # the rank that timed out dumped
    reached = {rank: last_collective(path) for rank, path in dumps.items()}
    behind = {r for r in (0, 1) if reached.get(r, -1) < max(reached.values())}
    assert behind == {1}, reached  # rank 1 never joined the collective rank 0 waited in
    assert "Fatal Python error: Aborted" in (logs / "rank-0.log").read_text()
