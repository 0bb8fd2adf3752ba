"""Rules for the whole suite: under CI a skipped test is a failure (a skip proves nothing).

Each tier has its own conftest: tests/unit (pure logic, about a minute), tests/local (real
multi-process runs on this machine, no Slurm) and tests/slurm (the real local cluster, which
the suite starts itself). The tiers run side by side in pytest-xdist workers (``-n auto`` in
pyproject.toml); `tests.fixtures.sharing` says what must not overlap and how it is kept apart.
"""

import os
import pathlib

import pytest

from tests.fixtures import sharing
from tests.fixtures.helpers import in_ci

# Tests start in this order. The Slurm tier mostly waits on the cluster and the local tier
# keeps the cores busy, so they are dealt out interleaved; the quick unit tests fill the end.
INTERLEAVED, LAST = ("slurm", "local"), ("unit",)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core (``PYTEST_XDIST_AUTO_NUM_WORKERS`` overrides it)."""
    return sharing.worker_count(os.cpu_count())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Deal the Slurm and local tiers out interleaved, the unit tier after them."""
    tiers: dict[str, list[pytest.Item]] = {}
    for item in items:
        tiers.setdefault(_tier(item), []).append(item)
    keyed = []
    for name in INTERLEAVED:
        tier = tiers.pop(name, [])
        keyed += [(index / len(tier), item) for index, item in enumerate(tier)]
    ordered = [item for _, item in sorted(keyed, key=lambda pair: pair[0])]
    ordered += [item for name in LAST for item in tiers.pop(name, [])]
    ordered += [item for rest in tiers.values() for item in rest]
    items[:] = ordered


def _tier(item: pytest.Item) -> str:
    parts = pathlib.Path(item.fspath).relative_to(pathlib.Path(__file__).parent).parts
    return parts[0] if len(parts) > 1 else ""


@pytest.fixture(autouse=True)
def _share_the_machine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A ``quiet`` test has the machine to itself; the others share it (xdist workers only)."""
    if not sharing.in_worker():
        yield
        return
    folder = tmp_path_factory.getbasetemp().parent  # the same for every worker of this run
    with sharing.machine(folder, quiet=request.node.get_closest_marker("quiet") is not None):
        yield


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Turn a green run with skips into a red one under CI."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if in_ci() and skipped and exitstatus == pytest.ExitCode.OK:
        reporter.write_line(f"CI=true: {skipped} test(s) skipped, which fails the run", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
