"""Tests for hpcddp.launch.hostlist: fixed tables from real scontrol, malformed input, speed.

Every expected list below was produced by ``scontrol show hostnames`` (Slurm 22.05), not by
reasoning about what it ought to print; tests/slurm/test_hostlist_scontrol.py re-checks these
tables and hundreds of seeded random expressions against scontrol itself.
"""

import random
import re
import time

import pytest

from hpcddp.errors import HostlistError
from hpcddp.launch.hostlist import compress, expand

# Recorded from `scontrol show hostnames EXPR` on Slurm 22.05.
EXPANSIONS = {
    "rack[1-2]-node[01-02]": ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"],
    "a[1-2]b[3-4]": ["a1b3", "a1b4", "a2b3", "a2b4"],
    "n[1-2][3-4]": ["n13", "n14", "n23", "n24"],
    # Three or more brackets: last fastest, then first, ..., next-to-last slowest.
    "a[1,2]b[3-4]c[5,6]": [
        "a1b3c5",
        "a1b3c6",
        "a2b3c5",
        "a2b3c6",
        "a1b4c5",
        "a1b4c6",
        "a2b4c5",
        "a2b4c6",
    ],
    "a[1-2]b[03-04]c[5]": ["a1b03c5", "a2b03c5", "a1b04c5", "a2b04c5"],
    "a[1-2]b[3-4]c[5-6]d[7-8]": [
        "a1b3c5d7",
        "a1b3c5d8",
        "a2b3c5d7",
        "a2b3c5d8",
        "a1b4c5d7",
        "a1b4c5d8",
        "a2b4c5d7",
        "a2b4c5d8",
        "a1b3c6d7",
        "a1b3c6d8",
        "a2b3c6d7",
        "a2b3c6d8",
        "a1b4c6d7",
        "a1b4c6d8",
        "a2b4c6d7",
        "a2b4c6d8",
    ],
    # Width is that of LO as written; HI's own width is ignored.
    "node[09-11]": ["node09", "node10", "node11"],
    "n[98-101]": ["n98", "n99", "n100", "n101"],
    "n[098-101]": ["n098", "n099", "n100", "n101"],
    "n[8-010]": ["n8", "n9", "n10"],
    "n[01-2]": ["n01", "n02"],
    "n[1-02]": ["n1", "n2"],
    "n[007]": ["n007"],
    "n[00-01],m": ["n00", "n01", "m"],
    "gpu-[001-003,010],cpu7": ["gpu-001", "gpu-002", "gpu-003", "gpu-010", "cpu7"],
    "n[1,3-4,7]": ["n1", "n3", "n4", "n7"],
    "n[01-02,9-10]": ["n01", "n02", "n9", "n10"],
    "a[1-2],b[3-4]c[5]": ["a1", "a2", "b3c5", "b4c5"],
    # Duplicates and overlaps are kept, in order.
    "n[1,1,2],n1": ["n1", "n1", "n2", "n1"],
    "n[1-3,2-4]": ["n1", "n2", "n3", "n2", "n3", "n4"],
    # Empty groups are skipped; whitespace separates groups like a comma.
    "": [],
    "a,,b": ["a", "b"],
    ",a": ["a"],
    "a,": ["a"],
    "a b": ["a", "b"],
    "n[1-2]\t,\tm": ["n1", "n2", "m"],
    # Names: empty prefix, digits before a bracket, hyphens and dots between brackets.
    "[1-2]": ["1", "2"],
    "n1[1-2]": ["n11", "n12"],
    "a-[1-2].x-[3]": ["a-1.x-3", "a-2.x-3"],
    "a_b[1-2]": ["a_b1", "a_b2"],
    "n-01": ["n-01"],
    "n.01": ["n.01"],
    "000000000000000000000000001": ["000000000000000000000000001"],
    "n[18446744073709551615]": ["n18446744073709551615"],
    "n[99999999999-100000000000]": ["n99999999999", "n100000000000"],
}

# Input scontrol rejects ("Invalid hostlist" on stderr; it still exits 0), with the part our
# message must name.
SCONTROL_REJECTS = {
    "n[5-3]": "5-3",
    "n[]": "''",
    "n[a-c]": "a-c",
    "n[-2]": "-2",
    "n[-]": "'-'",
    "n[1-2-3]": "1-2-3",
    "n[1--2]": "1--2",
    "n[1,]": "''",
    "n[,1]": "''",
    "n[1;2]": "1;2",
    "n[1x]": "1x",
    "n[0x1-2]": "0x1-2",
    "n[1-2 ]": "1-2 ",
    "n[[1-2]]": "nested '['",
    "n[1-2]]": "unmatched ']'",
    "a.b[1-2].c": ".c",
    "a[1-2]b": "'b'",
    "a[1]b[2]c": "'c'",
    "n[1-2],[3-4]x": "'x'",
    "n[0-65536]": "0-65536",
}

# Input scontrol accepts but turns into names nobody meant (its output in the comment), so we
# reject it rather than copy it.
STRICTER_THAN_SCONTROL = {
    "n[1-]": "1-",  # n1
    "n[1-2": "unclosed '['",  # n]
    "n1-2]": "unmatched ']'",  # n1-2]
    "n[": "unclosed '['",  # n]
    "n[1 -2]": "1 -2",  # n01 n02 (strtoul skips the space, which still counts as width)
    "n[+1-2]": "+1-2",  # n01 n02
    "n[18446744073709551616]": "18446744073709551616",  # n18446744073709551615
    "n18446744073709551616": "18446744073709551616",  # n18446744073709551615
    "n[\N{SUPERSCRIPT TWO}]": "\N{SUPERSCRIPT TWO}",  # str.isdigit() would accept it
}

COMPRESSIONS = [
    (["node01", "node02", "node03", "node10"], "node[01-03,10]"),
    (["n9", "n10", "n11"], "n[9-11]"),
    (["n009", "n10"], "n[009,10]"),
    (["n1", "n1"], "n[1,1]"),
    (["n1", "m1", "n2"], "n1,m1,n2"),
    (["a", "b", "a"], "a,b,a"),
    (["rack1-node01", "rack1-node02", "rack2-node01"], "rack1-node[01-02],rack2-node01"),
    ([], ""),
]


@pytest.mark.parametrize("expr, hosts", EXPANSIONS.items())
def test_expand_matches_recorded_scontrol(expr, hosts):
    assert expand(expr) == hosts


@pytest.mark.parametrize("expr, bad_part", {**SCONTROL_REJECTS, **STRICTER_THAN_SCONTROL}.items())
def test_malformed_input_is_rejected_with_a_hint(expr, bad_part):
    with pytest.raises(HostlistError) as caught:
        expand(expr)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert bad_part in message
    assert re.search(r"\. HINT: \S.*$", message), message


@pytest.mark.parametrize("hosts, expected", COMPRESSIONS)
def test_compress_is_compact(hosts, expected):
    assert compress(hosts) == expected
    assert expand(compress(hosts)) == hosts


@pytest.mark.parametrize("host", ["", "a,b", "a b", "n[1]", "n]", "n18446744073709551616"])
def test_compress_rejects_unwritable_names(host):
    with pytest.raises(HostlistError, match="HINT: "):
        compress(["n1", host])


def random_host(rng):
    """A host name: a few prefixes, numbers of mixed widths, some names without a number."""
    prefix = rng.choice(["node", "n", "gpu-", "rack1-node", "a.b-", "x_y", ""])
    if rng.random() < 0.15:
        return prefix + "z"
    number = rng.choice([rng.randint(0, 12), rng.randint(95, 105), rng.randint(0, 10**6)])
    return f"{prefix}{number:0{rng.randint(1, 4)}d}"


def test_compress_round_trips_random_lists():
    rng = random.Random(20240501)
    for _ in range(300):
        hosts = [random_host(rng) for _ in range(rng.randint(0, 30))]
        if rng.random() < 0.5:
            hosts.sort()  # sorted input is what compresses well; check it still round-trips
        assert expand(compress(hosts)) == hosts


@pytest.mark.quiet  # it times something: no other test runs beside it
def test_ten_thousand_nodes_expand_quickly():
    # The target is < 10 ms; the assertion allows 5x so a busy CI machine does not flake.
    runs_s = []
    for _ in range(5):
        started = time.perf_counter()
        hosts = expand("node[00001-10000]")
        runs_s.append(time.perf_counter() - started)
    print(f"expand of 10,000 nodes: best of 5 = {min(runs_s) * 1000:.2f} ms")
    assert hosts[0] == "node00001" and hosts[-1] == "node10000" and len(hosts) == 10000
    assert min(runs_s) < 0.050
