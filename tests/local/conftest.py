"""The local tier: real multi-process runs on this machine, without Slurm.

``hpcddp train --nproc N``, submitit's local executor and the trainer's own behaviour across
ranks (exact resume, stops, parity with a hand-written DDP loop, bad input end to end). Each
test starts real Python processes that import torch, so this tier takes a few minutes.
"""

import pytest

from tests.fixtures.helpers import clear_launcher_environment


@pytest.fixture(autouse=True)
def _no_outer_launcher(monkeypatch):
    """Ranks started here must number themselves, not inherit an outer job's variables."""
    clear_launcher_environment(monkeypatch)
