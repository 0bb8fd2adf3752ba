"""What needs two GPUs: 2 NCCL ranks, one GPU each, in each precision, `hpcddp check` across
them, and a hung NCCL collective whose flight recorder dumps name the rank that is behind."""

import pathlib

import pytest

from hpcddp.records import nccl_blame
from tests.fixtures.helpers import QUICK, QUICKSTART, run_cli, summary, train_local

pytestmark = pytest.mark.gpus(2)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_two_nccl_ranks_train_the_quickstart_in_each_precision(tmp_path, precision):
    done = train_local(tmp_path, *QUICK, f"train.precision={precision}")
    got = summary(tmp_path)
    assert got["steps"] > 0 and got["final_loss"] == got["final_loss"]  # finite, not NaN
    log = (tmp_path / "logs" / "rank-1.log").read_text()
    assert "device cuda:1, backend nccl" in log, done.stderr[-2000:]


def test_check_shows_the_nccl_rows_of_two_ranks(tmp_path):
    done = run_cli("check", QUICKSTART, f"run.dir={tmp_path}", "--nproc", "2", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "all-reduce (nccl, 2 ranks)" in done.stdout, done.stdout


def test_a_hung_nccl_collective_leaves_dumps_that_name_the_rank_behind(tmp_path):
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
        env={"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "3000"},  # 4x this after the timeout, not 60 s
    )
    assert done.returncode != 0 and done.returncode != 2, done.stderr[-3000:]
    logs = tmp_path / "logs"
    files = nccl_blame.dump_files(logs)
    # both ranks must have dumped: a rank without a dump could be the one behind
    assert sorted(files) == [0, 1], sorted(p.name for p in logs.iterdir())
    dumps = {rank: nccl_blame.parse(rank, pathlib.Path(path).read_bytes())
             for rank, path in files.items()}  # fmt: skip
    assert all(dumps.values()), dumps
    blame = nccl_blame.behind(dumps)
    assert blame.ranks == (1,), blame  # the waiter (rank 0) was aborted; rank 1 is behind
    assert "Fatal Python error: Aborted" in (logs / "rank-0.log").read_text()
