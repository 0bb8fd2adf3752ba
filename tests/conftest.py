"""Rules for the whole suite: under CI a skipped test is a failure (a skip proves nothing).

Each tier has its own conftest: tests/unit (pure logic, about a minute), tests/local (real
multi-process runs on this machine, no Slurm) and tests/slurm (the real local cluster, which
the suite starts itself).
"""

import pytest

from tests.fixtures.helpers import in_ci


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Turn a green run with skips into a red one under CI."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if in_ci() and skipped and exitstatus == pytest.ExitCode.OK:
        reporter.write_line(f"CI=true: {skipped} test(s) skipped, which fails the run", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
