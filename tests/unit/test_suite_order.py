"""The suite's own scheduling: the longest tests it starts first, the clusters it boots."""

import ast
import pathlib

from tests.conftest import longest_tests
from tests.fixtures import cluster_boot, sharing
from tests.fixtures.helpers import REPO

MAIN, SPARE = (cluster_boot.MAIN_INSTANCE, None), (cluster_boot.SPARE_INSTANCE, 3)


def test_every_longest_test_exists():
    """A renamed test would silently lose its early start; name it here instead."""
    names = longest_tests()
    assert len(names) == len(set(names)) >= 10
    for name in names:
        path, function = name.split("::")
        tree = ast.parse((REPO / path).read_text())
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert function.split("[")[0] in defined, f"tests/longest.txt: {name} is not a test"


def test_the_clusters_booted_are_those_the_run_needs():
    tests = REPO / "tests"
    assert cluster_boot.needed([tests], "") == [MAIN, SPARE]  # the README's command
    assert cluster_boot.needed([tests / "slurm"], "not benchmark") == [MAIN, SPARE]
    assert cluster_boot.needed([tests / "slurm" / "test_sbatch.py"], "") == [MAIN]
    assert cluster_boot.needed([tests / "unit", tests / "local"], "") == []
    assert cluster_boot.needed([tests], "not slurm") == []
    relative = pathlib.Path("tests/slurm/test_sbatch.py")  # as typed in the repository root
    assert cluster_boot.needed([REPO / relative], "") == [MAIN]


def test_the_worker_count_is_two_per_core_unless_the_environment_chooses():
    assert sharing.worker_count(2, {}) == 4
    assert sharing.worker_count(1, {}) == 2 and sharing.worker_count(64, {}) == 8
    assert sharing.worker_count(2, {"PYTEST_XDIST_AUTO_NUM_WORKERS": "3"}) == 3
    assert sharing.worker_count(2, {"PYTEST_XDIST_AUTO_NUM_WORKERS": "x"}) == 4
