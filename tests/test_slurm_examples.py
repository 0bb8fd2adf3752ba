"""The realistic example across two nodes: its corpus fetched once, through the guarded download."""

import os

import pytest

from tests.helpers import REPO, LoopbackServer, summary
from tests.test_slurm_sbatch import sbatch_wait

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
# The bridge address of the cluster's "login node" (tests/cluster/local-slurm.sh): the nodes
# reach this machine there, as compute nodes reach a site's file server.
LOGIN_NODE = os.environ.get("HPCDDP_SLURM_NET_PREFIX", "10.213.0") + ".1"


def test_chargpt_trains_on_two_nodes_from_one_fetch(slurm_cluster, tmp_path):
    with LoopbackServer(REPO / "examples" / "data", host=LOGIN_NODE) as server:
        run_dir = tmp_path / "run"
        sbatch_wait(slurm_cluster, tmp_path, "examples/chargpt.yaml", f"run.dir={run_dir}",
                    f"data.kwargs.url={server.url}/tiny-corpus.txt",
                    f"data.kwargs.root={tmp_path / 'data'}", "train.max_steps=12",
                    "train.log_every_steps=4", options=["--nodes=2", "--ntasks-per-node=2"])
        fetches = server.count("/tiny-corpus.txt")
    done = summary(run_dir)
    assert done["world_size"] == 4 and done["hosts"] == ["n1", "n1", "n2", "n2"]
    assert done["steps"] == 12 and done["eval_loss"] < 4.5
    assert fetches == 1  # one rank fetched for the whole job; the others waited and found it
    assert (tmp_path / "data" / "tiny-corpus.txt").exists()
