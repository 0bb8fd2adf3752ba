"""The unit tier: pure logic in this process, plus small subprocesses; no cluster, no ranks.

Slurm, torchrun and submitit are faked only at their edges (environment mappings, stub
commands on PATH). Runs in about a minute.
"""

import pytest

from tests.fixtures.helpers import clear_launcher_environment


@pytest.fixture(autouse=True)
def _no_outer_launcher(monkeypatch):
    """A test must see only the launch variables it sets, even when pytest runs inside a job."""
    clear_launcher_environment(monkeypatch)
