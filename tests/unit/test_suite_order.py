"""The suite's own scheduling: the longest tests it starts first, the clusters it boots, how
its workers share the machine and the runs several tests read."""

import ast
import concurrent.futures
import pathlib
import threading

import pytest

from tests.conftest import longest_tests, pytest_collection_modifyitems
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


def _holding(folder, quiet: bool, release: threading.Event) -> threading.Event:
    """A thread that holds the machine (quiet or not) until ``release``; set once it holds."""
    holds = threading.Event()

    def hold():
        with sharing.machine(folder, quiet=quiet):
            holds.set()
            release.wait(10)

    threading.Thread(target=hold, daemon=True).start()
    return holds


def test_a_quiet_test_has_the_machine_alone_and_no_other_test_waits_behind_it(tmp_path):
    running, quiet_done = threading.Event(), threading.Event()
    assert _holding(tmp_path, quiet=False, release=running).wait(5)
    quiet = _holding(tmp_path, quiet=True, release=quiet_done)
    assert not quiet.wait(0.3)  # it waits for the running test
    # a test dealt out meanwhile starts at once, beside the running one
    assert _holding(tmp_path, quiet=False, release=threading.Event()).wait(2)
    running.set()  # ... and the quiet one still waits for that later one
    assert not quiet.wait(0.3)


def test_a_quiet_test_keeps_the_others_out_while_it_runs(tmp_path):
    done = threading.Event()
    assert _holding(tmp_path, quiet=True, release=done).wait(5)
    other = _holding(tmp_path, quiet=False, release=threading.Event())
    assert not other.wait(0.3)
    done.set()
    assert other.wait(5)


def test_a_shared_run_is_made_once_and_made_again_after_a_failure(tmp_path):
    made = []

    def make(run_dir):
        made.append(run_dir)
        run_dir.mkdir()
        (run_dir / "summary.json").write_text("{}")

    def fail(run_dir):
        run_dir.mkdir()
        raise AssertionError("the run failed")

    with pytest.raises(AssertionError):
        sharing.shared_run(tmp_path, ["a", "b"], fail)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # tests on several workers at once
        dirs = list(pool.map(lambda _: sharing.shared_run(tmp_path, ["a", "b"], make), range(4)))
    assert len(made) == 1 and set(dirs) == {made[0]}
    assert (made[0] / "summary.json").exists()
    assert sharing.shared_run(tmp_path, ["a", "c"], make) != made[0]  # other args: another run
    assert len(made) == 2


class _Item:
    """What the suite's ordering reads of a collected test: its id, file and marks."""

    def __init__(self, path: str, *marks: str):
        self.nodeid, self.fspath, self.marks = f"{path}::t", REPO / path, marks

    def get_closest_marker(self, name: str):
        return name if name in self.marks else None


def test_the_quiet_tests_start_last_and_the_slow_unit_tests_before_the_quick_ones():
    quick, slow = _Item("tests/unit/test_a.py"), _Item("tests/unit/test_b.py", "slow")
    quiet, local = _Item("tests/unit/test_c.py", "quiet"), _Item("tests/local/test_d.py")
    items = [quiet, quick, slow, local]
    pytest_collection_modifyitems(items)
    assert items == [local, slow, quick, quiet]


def test_every_case_of_a_longest_test_listed_without_parameters_starts_first(monkeypatch):
    listed = "tests/slurm/test_x.py::t"
    monkeypatch.setattr("tests.conftest.longest_tests", lambda: [listed])
    other, ddp, fsdp = (_Item("tests/slurm/test_x.py") for _ in range(3))
    other.nodeid, ddp.nodeid, fsdp.nodeid = (
        "tests/slurm/test_x.py::u",
        f"{listed}[ddp]",
        f"{listed}[fsdp]",
    )
    items = [other, ddp, fsdp]
    pytest_collection_modifyitems(items)
    assert items == [ddp, fsdp, other]
