"""The job script carries out hpcddp's word on a signal that came while no step ran
(`hpcddp.resilience.rules.between_steps`), run against stand-ins for Slurm's tools.

A rank dies on n1 and the policy restarts the step on the spare n2; while the policy helper
answers, the batch shell gets a signal. A SIGTERM (scancel, a requeue) then ends the job with
the first step's status; a SIGUSR2 lets the restart go ahead.
"""

import re
import signal
import sys

import pytest

from hpcddp.slurm import jobscript
from tests.unit.test_containers import RECORD
from tests.unit.test_containers import job as job  # the fixture
from tests.unit.test_jobscript import calls, stub

# The first step dies on n1 (and tells the shell's pid); the restart succeeds.
SRUN = (
    RECORD
    + """
if [[ ! -f "$STUB_DIR/shell.pid" ]]; then
    echo "$PPID" > "$STUB_DIR/shell.pid"
    echo "srun: error: n1: task 0: Killed" >&2
    exit 137
fi
"""
)
# The job's Python: signals the batch shell once, while the policy decides after the death.
PYTHON = """#!/bin/bash
if [[ " $* " == *" hpcddp.slurm.policy after "* && ! -f "$STUB_DIR/signalled" ]]; then
    touch "$STUB_DIR/signalled"
    kill -s "$SIGNAL" "$(cat "$STUB_DIR/shell.pid")"
fi
exec {python} "$@"
"""


@pytest.mark.parametrize(
    "sig, steps, status",
    [(signal.SIGTERM, 1, 137), (signal.SIGUSR2, 2, 0)],
    ids=["term-ends-the-job", "usr2-lets-the-restart-run"],
)
def test_a_signal_between_steps_is_hpcddp_s_decision(job, tmp_path, sig, steps, status):
    python = tmp_path / "bin" / "job-python"
    stub(tmp_path / "bin", "job-python", PYTHON.format(python=sys.executable))
    environ = {"HPCDDP_PYTHON": str(python), "SIGNAL": sig.name[3:]}
    spare = {"nodes": 1, "spare_nodes": 1}
    done = job(spare, "slurm.spare_nodes=1", srun=SRUN, environ=environ)
    assert (tmp_path / "signalled").exists(), done.stderr
    assert done.returncode == status, done.stderr
    ranks = calls(tmp_path, "srun")
    assert len(ranks) == steps, done.stderr
    assert "--nodelist=n1" in ranks[0]
    if steps == 2:
        assert "--nodelist=n2" in ranks[1]  # the spare took n1's place
    assert f"SIG{sig.name[3:]} received" in done.stderr
    assert [c for c in calls(tmp_path, "scontrol") if c[0] != "-o"] == []  # no requeue


def test_the_template_leaves_node_states_and_signals_to_hpcddp():
    """The shell carries decisions out; which sinfo states are usable and what a signal
    between steps means are `hpcddp.resilience.rules`'."""
    text = jobscript.template()
    assert not re.search(r"\b(idle|mix|alloc|comp|down|drain)\b", text)
    loop = text[text.index("\nwhile ") :]
    loop = loop[: loop.index("; do")]
    assert "terminated" not in loop and "TERM" not in loop
