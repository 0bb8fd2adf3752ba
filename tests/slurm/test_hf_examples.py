"""The HF examples (vision ResNet, GPT-2 LM) train across two nodes and resume bit for bit;
GPT-2 sharded (``dist.strategy=fsdp``: its ``transformer.h`` blocks, bf16 gathers).

Per example: one job trains straight to step 8; another stops at step 4 (checkpoint kept),
then a third resumes it to step 8; the two step-8 weights must be equal. The straight job and
the first half of the stopped one run side by side to keep the tier short.
"""

import pytest

from tests.fixtures.helpers import summary

pytestmark = pytest.mark.slow
NODES = ("--nodes=2", "--ntasks-per-node=1")
EXAMPLES = {
    "vision": ["examples/vision/resnet.yaml", "data.kwargs.train_size=256"],
    "lm": ["examples/lm/gpt2.yaml", "data.kwargs.train_size=512", "dist.strategy=fsdp"],
}
SHORT = ["train.max_steps=8", "train.checkpoint_every_steps=3", "train.log_every_steps=2"]


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_hf_example_trains_on_two_nodes_and_resumes_exactly(slurm_cluster, tmp_path, example):
    config, *sized = EXAMPLES[example]
    common = ["sbatch/train.sh", config, *sized, *SHORT]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    jobs = [
        slurm_cluster.sbatch(tmp_path, *common, f"run.dir={run_dir}", *extra, options=NODES,
                             wait=False)[0]
        for run_dir, extra in ((straight, []), (stopped, ["train.stop_after_steps=4"]))
    ]  # fmt: skip
    for job in jobs:
        state = slurm_cluster.wait_for(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
        assert state == "COMPLETED", slurm_cluster.output(tmp_path, job)[-4000:]
    assert not (stopped / "summary.json").exists()
    if "dist.strategy=fsdp" in sized:  # resumed from every rank's shards
        assert {c.suffix for c in (stopped / "checkpoints").iterdir()} == {".dcp"}
    slurm_cluster.sbatch(tmp_path, *common, f"run.dir={stopped}", options=NODES)
    expected, resumed = summary(straight), summary(stopped)
    assert expected["hosts"] == slurm_cluster.ranks_on(2, 1)
    assert resumed["weights_sha256"] == expected["weights_sha256"]
    assert resumed["steps"] == expected["steps"] == 8
    metric = "eval_accuracy" if example == "vision" else "eval_perplexity"
    assert resumed[metric] == expected[metric] and expected[metric] > 0
