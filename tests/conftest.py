"""Rules for the whole suite: under CI a skipped test is a failure (a skip proves nothing).

Each tier has its own conftest: tests/unit (pure logic, about a minute), tests/local (real
multi-process runs on this machine, no Slurm) and tests/slurm (the real local cluster, which
the suite starts itself). The tiers run side by side in pytest-xdist workers (``-n auto`` in
pyproject.toml); `tests.fixtures.sharing` says what must not overlap and how it is kept apart.
"""

import compileall
import importlib.util
import os
import pathlib

import pytest

from tests.fixtures import cluster_boot, gpu_tier, sharing
from tests.fixtures.helpers import REPO, in_ci

# Tests start in this order: the longest first (tests/longest.txt), then the Slurm and local
# tiers interleaved (the Slurm tier mostly waits on the cluster while the local tier keeps the
# cores busy), the quick unit tests (those marked slow, which start ranks, first of them), and
# the quiet tests last: each has the machine to itself, so it waits for every running test; a
# slow one among the last to start kept it (and the cores) waiting up to 35 s.
INTERLEAVED, LAST = ("slurm", "local"), ("unit",)
LONGEST = pathlib.Path(__file__).parent / "longest.txt"


def pytest_configure(config: pytest.Config) -> None:
    """On a GPU machine every tier but the GPU tier runs on CPU (`tests.fixtures.gpu_tier`)."""
    gpu_tier.hide_gpus_unless_asked(config.args, REPO, os.environ)


@pytest.hookimpl(optionalhook=True)  # the GPU tier runs with -p no:xdist
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core (``PYTEST_XDIST_AUTO_NUM_WORKERS`` overrides it)."""
    return sharing.worker_count(os.cpu_count(), os.environ)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Boot the Slurm clusters this run needs in the background, and meanwhile compile the
    code every test process imports: once, in the controller (not in each worker)."""
    if sharing.in_worker() or session.config.option.collectonly:
        return
    if os.geteuid() == 0:  # without root the Slurm fixtures say why they cannot start a cluster
        paths = [pathlib.Path(arg.split("::")[0]) for arg in session.config.args]
        clusters = cluster_boot.needed(paths, session.config.option.markexpr or "")
        if clusters:
            cluster_boot.boot_in_background(clusters)
    _compile_once()


def _compile_once() -> None:
    """Write the bytecode every test process reads, once, on every core. Under
    PYTHONDONTWRITEBYTECODE=1 (set on some machines, this one included) no process writes it,
    so each of the suite's thousands of Pythons (ranks, launchers, helpers) would compile
    hpcddp again (about 0.09 CPU-s each), and torch without its bytecode many times that.
    The README's command installs with ``pip --no-compile``: pip compiles the installed
    packages on one core (32 s of the install here), this on all of them. A venv that pip
    compiled (torch has its bytecode) is not walked again."""
    folders = [REPO / folder for folder in ("hpcddp", "examples", "tests")]
    torch_init = pathlib.Path(_torch_init())
    if not _has_bytecode(torch_init):
        folders.append(torch_init.parents[1])  # site-packages: every installed package
    for folder in folders:
        # a few packages ship files that do not compile (templates, Python 2 examples)
        compileall.compile_dir(folder, quiet=2, workers=0)


def _torch_init() -> str:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None, "torch is not installed"
    return spec.origin


def _has_bytecode(source: pathlib.Path) -> bool:
    return pathlib.Path(importlib.util.cache_from_source(str(source))).exists()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the tests as the comment above says."""
    longest = {name: rank for rank, name in enumerate(longest_tests())}
    quiet = [item for item in items if item.get_closest_marker("quiet")]
    first = sorted(
        (item for item in items if _listed(item, longest) is not None),
        key=lambda item: _listed(item, longest),
    )
    placed = {id(item) for item in (*quiet, *first)}
    tiers: dict[str, list[pytest.Item]] = {}
    for item in items:
        if id(item) not in placed:
            tiers.setdefault(_tier(item), []).append(item)
    keyed = []
    for name in INTERLEAVED:
        tier = tiers.pop(name, [])
        keyed += [(index / len(tier), item) for index, item in enumerate(tier)]
    ordered = first + [item for _, item in sorted(keyed, key=lambda pair: pair[0])]
    for name in LAST:
        ordered += sorted(tiers.pop(name, []), key=lambda item: not item.get_closest_marker("slow"))
    ordered += [item for rest in tiers.values() for item in rest]
    items[:] = ordered + quiet


def _listed(item: pytest.Item, longest: dict[str, int]) -> int | None:
    """The test's place in tests/longest.txt: by its id, or (every case of a parametrized
    test) by its id without the parameters."""
    return longest.get(item.nodeid, longest.get(item.nodeid.partition("[")[0]))


def longest_tests() -> list[str]:
    """The test ids in tests/longest.txt, longest first."""
    lines = LONGEST.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


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


@pytest.fixture
def shared_run(tmp_path_factory: pytest.TempPathFactory):
    """``shared_run(args, make)``: the run ``make(run_dir)`` made once this session for ``args``
    and read by every test that asks (`tests.fixtures.sharing.shared_run`)."""
    base = tmp_path_factory.getbasetemp()
    folder = base.parent if sharing.in_worker() else base  # a worker's is popen-gwN/

    def get(args, make):
        return sharing.shared_run(folder, list(args), make)

    return get


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Turn a green run with skips into a red one under CI."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if in_ci() and skipped and exitstatus == pytest.ExitCode.OK:
        reporter.write_line(f"CI=true: {skipped} test(s) skipped, which fails the run", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
