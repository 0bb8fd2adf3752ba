"""dist.strategy=fsdp end to end: a 4-rank sharded run stopped mid-epoch resumes on 4, 2 and 3
ranks, checkpoints move between ddp and fsdp with the weights exact, a torn save is skipped.

The model is a tiny transformer of three blocks (`tests.fixtures.sharded_transformer`) that
writes down the id of every sample it trains on. 96 samples, micro-batches of 2: a global batch
of 24 (accumulation 3 on 4 ranks, 6 on 2, 4 on 3), 4 steps an epoch, 2 epochs. The stop after
step 6 is half-way through the second epoch.
"""

import collections
import json
import pathlib
import shutil

import pytest

from tests.fixtures.helpers import run_cli, summary
from tests.fixtures.sharing import in_worker, locked

CONFIG = "tests/fixtures/sharded_transformer.yaml"
# At another world size each step sees the same samples, summed in another order, with dropout
# masks drawn afresh (each rank's stream cannot carry over): measured 0.005 apart at a loss of
# 0.97; a run that lost its weights or optimizer state is 0.3 or more away.
LOSS_TOLERANCE = 0.05


def _train(
    run_dir: pathlib.Path, nproc: int, *extra: str, ids: pathlib.Path | None = None, config=CONFIG
):
    env = {"SAMPLE_IDS_DIR": str(ids)} if ids else {}
    if ids:
        ids.mkdir(parents=True, exist_ok=True)
    result = run_cli("train", config, f"run.dir={run_dir}", *extra, "--nproc", str(nproc), env=env)
    return result


def _ok(result):
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _ids(folder: pathlib.Path) -> collections.Counter:
    return collections.Counter(
        int(line) for f in folder.glob("ids-*.txt") for line in f.read_text().split()
    )


def _losses(run_dir: pathlib.Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line]
    return {r["step"]: r["loss"] for r in records if "loss" in r and "step" in r}


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """The uninterrupted 4-rank run, and one stopped after step 6 (its checkpoint there): made
    once for the whole session, whichever worker asks first (the others wait, then read)."""
    base = tmp_path_factory.getbasetemp()  # an xdist worker's: popen-gwN in the session's
    root = (base.parent if in_worker() else base) / "fsdp-four-ranks"
    root.mkdir(exist_ok=True)
    with locked(root / ".lock"):
        if not (root / "made").exists():
            whole, stopped = root / "whole", root / "stopped"
            _ok(_train(whole, 4, ids=root / "ids-whole"))
            _ok(_train(stopped, 4, "train.stop_after_steps=6", ids=root / "ids-stopped"))
            (root / "made").touch()
    checkpoints = sorted(p.name for p in (root / "stopped" / "checkpoints").iterdir())
    assert checkpoints[-1] == "step-00000006.dcp"
    return root


@pytest.mark.parametrize("nproc", [4, 2, 3])
def test_stopped_fsdp_run_resumes_on_any_number_of_ranks(four_ranks, tmp_path, nproc):
    root = four_ranks
    resumed = tmp_path / "resumed"
    shutil.copytree(root / "stopped", resumed)
    result = _ok(_train(resumed, nproc, ids=tmp_path / "ids"))
    # each remaining sample of the interrupted epoch exactly once: with the 6 steps before the
    # stop, every sample twice in two epochs
    seen = _ids(root / "ids-stopped") + _ids(tmp_path / "ids")
    assert sorted(seen) == list(range(96))
    assert set(seen.values()) == {2}, {i: n for i, n in seen.items() if n != 2}
    assert _ids(tmp_path / "ids").total() == 2 * 24
    done = summary(resumed)
    assert done["steps"] == 8
    expected = summary(root / "whole")
    if nproc == 4:  # the same world: bitwise the uninterrupted run
        assert done["weights_sha256"] == expected["weights_sha256"]
    else:
        assert f"train.grad_accum_steps 3 -> {24 // (2 * nproc)}" in result.stdout + result.stderr
        ours, theirs = _losses(resumed), _losses(root / "whole")
        for step in (7, 8):
            assert abs(ours[step] - theirs[step]) <= LOSS_TOLERANCE, (
                step,
                ours[step],
                theirs[step],
            )


def _digest_in_log(run_dir: pathlib.Path) -> str:
    """The 12 hex digits of the weights the last run of ``run_dir`` finished with."""
    lines = (run_dir / "logs" / "rank-0.log").read_text().splitlines()
    return [line for line in lines if "finished:" in line][-1].rsplit("weights ", 1)[1].strip()


def test_checkpoints_move_between_strategies_with_the_weights_exact(four_ranks, tmp_path):
    """A finished run resumed under the other strategy loads its checkpoint and finishes with
    the very same weights (gathered whole under fsdp): ddp -> fsdp on 2 ranks, and the 4-rank
    fsdp run's sharded checkpoint -> ddp on 2 ranks."""
    steps = "train.max_steps=2"
    _ok(_train(tmp_path / "ddp", 2, "dist.strategy=ddp", steps))
    _ok(_train(tmp_path / "ddp", 2, "dist.strategy=fsdp", steps))
    assert _digest_in_log(tmp_path / "ddp") == summary(tmp_path / "ddp")["weights_sha256"][:12]
    sharded = tmp_path / "fsdp"
    shutil.copytree(four_ranks / "whole", sharded)
    _ok(_train(sharded, 2, "dist.strategy=ddp"))
    assert "resumed from step-00000008.dcp" in (sharded / "logs" / "rank-0.log").read_text()
    assert _digest_in_log(sharded) == summary(sharded)["weights_sha256"][:12]


def test_checkpoint_torn_by_a_killed_rank_or_corrupted_later_is_skipped(tmp_path):
    """Rank 1 dies while writing the checkpoint of step 4: the job fails; the next attempt
    resumes from step 2, the newest complete one, and finishes. Then one byte of rank 1's shard
    of step 6 flips (same size): a run resumes from step 4, saying which file failed."""
    config = ["model.factory=tests.fixtures.torn_save:make_model", "train.max_steps=6"]
    killed = run_cli(
        "train", CONFIG, f"run.dir={tmp_path}", *config, "--nproc", "2",
        env={"TORN_STEP": "4", "TORN_RANK": "1"},
    )  # fmt: skip
    assert killed.returncode != 0
    torn = tmp_path / "checkpoints" / "step-00000004.dcp"
    assert torn.is_dir() and any(torn.glob("*.distcp")) and not (torn / "COMPLETE").exists()
    _ok(_train(tmp_path, 2, *config))
    log = (tmp_path / "logs" / "rank-0.log").read_text()
    assert "resumed from step 2 (step-00000002.dcp)" in log
    assert summary(tmp_path)["steps"] == 6
    shard = tmp_path / "checkpoints" / "step-00000006.dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    _ok(_train(tmp_path, 2, *config))
    log = (tmp_path / "logs" / "rank-0.log").read_text()
    assert "rank 1: CheckpointError" in log and "__1_0.distcp does not match its digest" in log
    assert "resumed from step 4 (step-00000004.dcp)" in log


def test_activation_checkpointing_keeps_the_loss_trajectory(tmp_path):
    """Recomputing each block's activations in the backward gives the same losses (dropout off:
    the comparison is of the arithmetic alone)."""
    common = ("model.kwargs={dropout: 0.0}", "train.max_steps=3", "train.checkpoint_every_steps=0")
    plain = _ok(_train(tmp_path / "plain", 2, *common))
    checkpointed = _ok(
        _train(tmp_path / "ac", 2, *common, "dist.fsdp_activation_checkpointing=true")
    )
    assert "activations recomputed per block" in checkpointed.stderr
    assert "activations recomputed" not in plain.stderr
    off, on = _losses(tmp_path / "plain"), _losses(tmp_path / "ac")
    assert sorted(off) == sorted(on) == [1, 2, 3]
    assert on == pytest.approx(off, rel=1e-5, abs=1e-6)


def test_fp16_overflow_in_one_rank_s_shard_skips_the_step_on_every_rank(tmp_path):
    """fp16 under fsdp: GradScaler's overflow check agrees across the ranks. The fixture's
    first steps overflow everywhere (at scale 2^16); at step 9 one gradient element overflows,
    in rank 1's shard only. Rank 0, whose shard is clean, must skip that step too: its loss
    scale (the one logged) halves there."""
    result = run_cli(
        "train", "tests/fixtures/fp16_transformer.yaml", f"run.dir={tmp_path}",
        "dist.strategy=fsdp", "model.kwargs={inf_grad_at_call: 9}", "--nproc", "2",
    )  # fmt: skip
    _ok(result)
    record = summary(tmp_path)
    assert (record["status"], record["steps"]) == ("finished", 12)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    scales = {line["step"]: line["loss_scale"] for line in lines if "loss" in line}
    assert scales[1] < 2.0**16  # the first step overflowed and was skipped
    assert scales[9] == scales[8] / 2 and record["overflow_steps"] >= 2


def test_the_offload_path_combines_the_gradient_norm_as_dtensor_does(tmp_path):
    """Under CPU offload (GPUs) the norm of the CPU-held sharded gradients is combined on the
    mesh's device, NCCL having no CPU collectives: 2 gloo ranks check that path's arithmetic
    against DTensor's own combination and the whole tensors' norm."""
    import os
    import subprocess
    import sys

    from tests.fixtures.helpers import REPO

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    env |= {"WORLD_SIZE": "2", "PYTHONPATH": str(REPO)}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.offload_norm", str(tmp_path)],
            env={**env, "RANK": str(rank)},
            cwd=REPO,
        )
        for rank in range(2)
    ]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    found = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    for rank in found:
        assert rank["through_device"] == pytest.approx(rank["whole"], rel=1e-6), found
        assert rank["through_device"] == pytest.approx(rank["dtensor"], rel=1e-6), found
        assert rank["own_part"] < rank["first_whole"]  # each rank held only a part of each


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
