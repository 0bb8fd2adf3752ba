"""`hpcddp.launch.hostlist` against Slurm's own ``scontrol show hostnames``, on the real install.

The recorded tables of tests/unit/test_hostlist.py are re-checked, and hundreds of seeded random
expressions (digit boundaries, padding, three and more brackets) must expand exactly as Slurm
expands them; what scontrol rejects, we reject too.
"""

import os
import random
import subprocess
import time

import pytest

from hpcddp.launch.hostlist import compress, expand
from tests.unit.test_hostlist import EXPANSIONS, SCONTROL_REJECTS


def run_scontrol(expr, conf):
    """Return (hosts, stderr) from `scontrol show hostnames EXPR` using the given slurm.conf."""
    # "--" because a generated name may start with "-", which scontrol would take as an option.
    result = subprocess.run(
        ["scontrol", "--", "show", "hostnames", expr],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SLURM_CONF": str(conf)},
        check=False,
    )
    return result.stdout.split(), result.stderr


def random_number(rng):
    """A number (as text) near a digit boundary, sometimes zero padded past its width."""
    value = rng.choice([rng.randint(0, 12), rng.randint(95, 102), rng.randint(996, 1002)])
    return f"{value:0{rng.randint(1, 4)}d}", value


def random_item(rng):
    """One bracket item: a single number or a short range, possibly crossing a digit count."""
    lo_text, lo = random_number(rng)
    if rng.random() < 0.35:
        return lo_text
    hi = lo + rng.randint(0, 4)
    return f"{lo_text}-{hi:0{rng.randint(1, 4)}d}"


def random_group(rng):
    """A host group: a literal name, or texts (letters, digits, '-', '.') with 1-4 brackets."""
    texts = ["", "n", "node", "gpu-", "rack", "-node", ".ib", "x.y-", "a1", "c-0", "_"]
    brackets = rng.choice([0, 1, 1, 1, 2, 2, 3, 4])
    if brackets == 0:
        return rng.choice(texts[1:]) + rng.choice(["", "7", "007", "10"])
    parts = []
    for _ in range(brackets):
        items = [random_item(rng) for _ in range(rng.randint(1, 3 if brackets < 3 else 2))]
        if rng.random() < 0.1:
            items.append(items[0])  # a duplicate inside the bracket
        parts.append(rng.choice(texts) + "[" + ",".join(items) + "]")
    return "".join(parts)


def random_expression(rng):
    """Several groups with mixed separators, sometimes repeating a group verbatim."""
    groups = [random_group(rng) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.2:
        groups.append(rng.choice(groups))
    return rng.choice([",", ",", " ", ",,"]).join(groups)


def test_oracle_random_expressions_match_scontrol(slurm_cluster):
    rng = random.Random(1234)
    started = time.perf_counter()
    for _ in range(300):
        expr = random_expression(rng)
        hosts, stderr = run_scontrol(expr, slurm_cluster.conf)
        assert not stderr, f"generator made an expression scontrol rejects: {expr!r}"
        assert expand(expr) == hosts, expr
        assert run_scontrol(compress(hosts), slurm_cluster.conf)[0] == hosts, expr
    print(f"oracle: 300 expressions in {time.perf_counter() - started:.1f} s")


@pytest.mark.parametrize("expr, hosts", EXPANSIONS.items())
def test_recorded_table_still_matches_scontrol(expr, hosts, slurm_cluster):
    assert run_scontrol(expr, slurm_cluster.conf)[0] == hosts


@pytest.mark.parametrize("expr", SCONTROL_REJECTS)
def test_scontrol_rejects_what_we_reject(expr, slurm_cluster):
    hosts, stderr = run_scontrol(expr, slurm_cluster.conf)
    assert hosts == [] and "Invalid hostlist" in stderr
