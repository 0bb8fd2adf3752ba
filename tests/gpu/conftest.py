"""The GPU tier: real NCCL runs on one GPU node, 2 ranks on 2 GPUs.

Collected only where CUDA is present: elsewhere the tier is left out of collection altogether
(``collect_ignore_glob``), so a CPU machine reports no skipped test for it. On a GPU node:
``python -m pytest tests/gpu``. Every test here needs 2 GPUs and says so if it has fewer.
"""

import pytest
import torch

from tests.fixtures.helpers import clear_launcher_environment

collect_ignore_glob = [] if torch.cuda.is_available() else ["test_*.py"]


@pytest.fixture(autouse=True)
def _two_gpus_and_no_outer_launcher(monkeypatch):
    """2 ranks, one GPU each; ranks started here number themselves."""
    count = torch.cuda.device_count()
    assert count >= 2, f"the GPU tier runs 2 NCCL ranks on 2 GPUs; this node shows {count}"
    clear_launcher_environment(monkeypatch)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # bitwise-repeatable matmuls
