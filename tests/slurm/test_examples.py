"""The realistic example across two nodes: its corpus fetched once, through the guarded download."""

import pytest

from tests.fixtures.helpers import REPO, LoopbackServer, summary

pytestmark = pytest.mark.slow


def test_chargpt_trains_on_two_nodes_from_one_fetch(slurm_cluster, tmp_path):
    # the nodes reach this machine at its bridge address, as they would a site's file server
    with LoopbackServer(REPO / "examples" / "data", host=slurm_cluster.login_addr) as server:
        run_dir = tmp_path / "run"
        slurm_cluster.sbatch(
            tmp_path,
            "sbatch/train.sh",
            "examples/chargpt.yaml",
            f"run.dir={run_dir}",
            f"data.kwargs.url={server.url}/tiny-corpus.txt",
            f"data.kwargs.root={tmp_path / 'data'}",
            "train.max_steps=12",
            "train.log_every_steps=4",
            options=("--nodes=2", "--ntasks-per-node=2"),
        )
        fetches = server.count("/tiny-corpus.txt")
    done = summary(run_dir)
    assert done["world_size"] == 4 and done["hosts"] == slurm_cluster.ranks_on(2, 2)
    assert done["steps"] == 12 and done["eval_loss"] < 4.5
    assert fetches == 1  # one rank fetched for the whole job; the others waited and found it
    assert (tmp_path / "data" / "tiny-corpus.txt").exists()
