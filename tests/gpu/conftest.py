"""The GPU tier: real CUDA and NCCL, on the GPUs of the machine it runs on.

Collected only where CUDA is present: elsewhere the tier is left out of collection altogether
(``collect_ignore_glob``), so a CPU machine reports no skipped test for it, and the root
conftest hides the GPUs from every other tier (`tests.fixtures.gpu_tier`). On a GPU machine:
``tests/gpu/run.sh`` (or ``python -m pytest -p no:xdist -o addopts=-ra tests/gpu``: one process,
since the tests share the GPUs). Rows marked ``gpus(n)`` need n GPUs; on a machine with fewer
they are deselected, not skipped, and the summary names each of them and what it needs.
"""

import pathlib

import pytest
import torch

from tests.fixtures.gpu_tier import needing_more_gpus
from tests.fixtures.helpers import clear_launcher_environment

collect_ignore_glob = [] if torch.cuda.is_available() else ["test_*.py"]

HERE = pathlib.Path(__file__).parent
_LEFT_OUT: list[tuple[str, int]] = []  # (test id, GPUs it needs) of the rows deselected here


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpus(n): the row needs n GPUs on this node")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Rows that need more GPUs than this node has are deselected and remembered.

    pytest hands this hook every item of the session, not only this folder's: the other tiers'
    items are left alone."""
    have = torch.cuda.device_count()
    needs = {item.nodeid: _needs(item) for item in items if HERE in item.path.parents}
    left_out = needing_more_gpus(needs, have)
    if not left_out:
        return
    _LEFT_OUT.extend((nodeid, needs[nodeid]) for nodeid in left_out)
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid in left_out])
    items[:] = [item for item in items if item.nodeid not in left_out]


def _needs(item: pytest.Item) -> int:
    marker = item.get_closest_marker("gpus")
    return int(marker.args[0]) if marker else 1


def pytest_terminal_summary(terminalreporter) -> None:
    """Say which rows this node could not run, and what they need."""
    if not _LEFT_OUT:
        return
    have = torch.cuda.device_count()
    terminalreporter.section(f"rows that need more GPUs than this node's {have}")
    for nodeid, count in _LEFT_OUT:
        terminalreporter.write_line(f"needs {count} GPUs: {nodeid}")


@pytest.fixture(autouse=True)
def _no_outer_launcher(monkeypatch):
    """Ranks started here number themselves; matmuls repeat bitwise."""
    clear_launcher_environment(monkeypatch)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
