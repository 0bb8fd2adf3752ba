"""Expand and compress Slurm hostlist expressions such as ``gpu-[001-003,010],cpu7``.

``expand`` must give exactly what ``scontrol show hostnames`` gives (Slurm 22.05), because the
result decides MASTER_ADDR and node ranks: a host list that differs from Slurm's by one name or
one position puts ranks on the wrong machines. Slurm's rules, checked against scontrol:

* Separators outside brackets are ``,``, space, tab and newline; empty groups are skipped.
* Inside brackets ``,`` separates items; an item is ``N`` or ``LO-HI`` in ASCII digits, and every
  number in it is zero padded to the width of ``LO`` as written (``[8-010]`` gives 8, 9, 10;
  ``[098-101]`` gives 098 ... 101). Duplicates and order are kept.
* A group may hold several brackets (``rack[1-2]-node[01-02]``) but nothing after the last one.
  With three or more brackets Slurm's odometer is unusual: the last bracket turns fastest, then
  the first, second, ... and the next-to-last slowest (``_push_range_list`` peels brackets from
  the right). We copy that order rather than "fix" it.

We reject, on purpose, a few inputs that scontrol turns into surprising names instead of an
error: unbalanced brackets, ``[1-]``, whitespace or ``+`` inside brackets, and numbers above
2**64-1 (strtoul saturates, so ``n18446744073709551616`` would become ``...615``).

A hand-written scanner rather than a regex: brackets nest in groups and groups in lists, and
the error messages need to name the exact bad part.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator

from hpcddp.errors import HostlistError

__all__ = ["HostlistError", "compress", "expand"]

_SEPARATORS = frozenset(", \t\n")
_DIGITS = frozenset("0123456789")  # str.isdigit() would also accept "²" and other scripts
_MAX_RANGE = 65536  # Slurm's MAX_RANGE: it rejects bigger single ranges, so must we
_MAX_NUMBER = 2**64 - 1  # C unsigned long; above it Slurm silently prints another number


def expand(expr: str) -> list[str]:
    """Return the host names of a Slurm hostlist expression, in Slurm's order.

    Raises HostlistError for input that Slurm would reject or silently misread.
    An empty (or all-separator) expression gives an empty list, as in scontrol.
    """
    hosts: list[str] = []
    for group in _split_groups(expr):
        hosts.extend(_expand_group(group))
    return hosts


def compress(hosts: Iterable[str]) -> str:
    """Return a compact expression whose expansion is exactly ``hosts`` (order, duplicates).

    Consecutive hosts sharing a prefix go into one bracket, ``node[01-03,10]``; hosts are
    never reordered, so the result is only as compact as the input order allows.
    """
    groups = []
    for (prefix, numbered), run in itertools.groupby(map(_split_host, hosts), key=_group_key):
        suffixes = [suffix or "" for _, suffix in run]
        if numbered and len(suffixes) > 1:
            groups.append(f"{prefix}[{','.join(_ranges(suffixes))}]")
        else:
            groups.extend(prefix + suffix for suffix in suffixes)
    return ",".join(groups)


def _error(what: str, where: str, hint: str) -> HostlistError:
    """Build the error; one format so every message names the bad part and ends with a HINT."""
    return HostlistError(f"{what} in {where!r}. HINT: {hint}")


def _split_groups(expr: str) -> list[str]:
    """Split ``expr`` at separators outside brackets, checking that brackets balance."""
    groups, start, opened = [], 0, -1
    for i, char in enumerate(expr):
        if char == "[":
            if opened >= 0:
                raise _error(f"nested '[' at position {i}", expr, "brackets cannot nest.")
            opened = i
        elif char == "]":
            if opened < 0:
                raise _error(f"unmatched ']' at position {i}", expr, "open it with '['.")
            opened = -1
        elif char in _SEPARATORS and opened < 0:
            groups.append(expr[start:i])
            start = i + 1
    if opened >= 0:
        raise _error(f"unclosed '[' at position {opened}", expr, "close it with ']'.")
    groups.append(expr[start:])
    return [group for group in groups if group]


def _expand_group(group: str) -> list[str]:
    """Expand one separator-free group, e.g. ``rack[1-2]-node[01-02]``."""
    texts, bodies = _split_brackets(group)
    if not bodies:
        _check_number(_trailing_digits(group), group)
        return [group]
    if len(bodies) == 1:  # the common case: one list comprehension, no product
        return _bracket_values(bodies[0], group, texts[0])
    values = [_bracket_values(body, group) for body in bodies]
    # Slurm's order: next-to-last bracket slowest, ..., first, then the last one fastest.
    pairs = zip(values[:-1], texts[1:], strict=True)
    heads = [[value + text for value in vals] for vals, text in pairs]
    prefixes = [texts[0] + "".join(reversed(combo)) for combo in itertools.product(*heads[::-1])]
    return [prefix + value for prefix in prefixes for value in values[-1]]


def _split_brackets(group: str) -> tuple[list[str], list[str]]:
    """Return the texts before each bracket and the bracket bodies (balanced already)."""
    texts, bodies, pos = [], [], 0
    while (open_at := group.find("[", pos)) >= 0:
        close_at = group.index("]", open_at)
        texts.append(group[pos:open_at])
        bodies.append(group[open_at + 1 : close_at])
        pos = close_at + 1
    if bodies and pos < len(group):
        raise _error(
            f"text {group[pos:]!r} after the last bracket",
            group,
            "Slurm allows nothing after the final ']'; move it before the bracket.",
        )
    return texts, bodies


def _bracket_values(body: str, group: str, prefix: str = "") -> list[str]:
    """Expand the comma-separated items of one bracket body, each prefixed with ``prefix``."""
    values: list[str] = []
    for item in body.split(","):
        values.extend(_range_values(item, group, prefix))
    return values


def _range_values(item: str, group: str, prefix: str) -> list[str]:
    """Expand ``N`` or ``LO-HI``, zero padded to the width of ``LO`` as Slurm does."""
    lo_text, dash, hi_text = item.partition("-")
    if not _is_number(lo_text) or (dash and not _is_number(hi_text)):
        raise _error(
            f"bad range {item!r}", group, "use N or LO-HI with digits only, e.g. node[01-04,7]."
        )
    _check_number(lo_text, group)
    _check_number(hi_text, group)
    lo = int(lo_text)
    hi = int(hi_text) if dash else lo
    if lo > hi:
        raise _error(f"reversed range {item!r}", group, f"write it low-high: {hi_text}-{lo_text}.")
    if hi - lo >= _MAX_RANGE:
        raise _error(f"range {item!r} has over {_MAX_RANGE} hosts", group, "split the range.")
    width = len(lo_text)
    return [f"{prefix}{number:0{width}d}" for number in range(lo, hi + 1)]


def _is_number(text: str) -> bool:
    """True for a non-empty run of ASCII digits (what Slurm's strtoul reads in full)."""
    return bool(text) and _DIGITS.issuperset(text)


def _check_number(digits: str, where: str) -> None:
    """Reject numbers Slurm's unsigned long cannot hold instead of letting them change."""
    # The length test comes first: int() of thousands of digits raises its own ValueError.
    if len(digits.lstrip("0")) > 20 or (digits and int(digits) > _MAX_NUMBER):
        raise _error(
            f"number {digits} is above 2**64-1",
            where,
            "Slurm would silently print a different name; shorten the number.",
        )


def _trailing_digits(host: str) -> str:
    """Return the ASCII digits that end ``host`` (Slurm's numeric suffix), maybe ''."""
    start = len(host)
    while start and host[start - 1] in _DIGITS:
        start -= 1
    return host[start:]


def _split_host(host: str) -> tuple[str, str | None]:
    """Split a host into (prefix, digit suffix); suffix None when it cannot go in a bracket."""
    if not host or any(char in _SEPARATORS or char in "[]" for char in host):
        raise _error(
            "host name that no hostlist can express",
            host,
            "names must be non-empty without brackets, commas or whitespace.",
        )
    digits = _trailing_digits(host)
    _check_number(digits, host)
    if not digits:
        return host, None
    return host[: -len(digits)], digits


def _group_key(split: tuple[str, str | None]) -> tuple[str, bool]:
    """Hosts can share a bracket only when they share a prefix and both have a number."""
    return split[0], split[1] is not None


def _ranges(suffixes: list[str]) -> Iterator[str]:
    """Yield bracket items (``07`` or ``08-10``) that expand back to exactly ``suffixes``."""
    start = 0
    for end in range(1, len(suffixes) + 1):
        if end == len(suffixes) or not _extends(suffixes[start], suffixes[end], end - start):
            first, width = suffixes[start], len(suffixes[start])
            last = int(first) + (end - 1 - start)
            yield first if end - start == 1 else f"{first}-{last:0{width}d}"
            start = end


def _extends(first: str, candidate: str, length: int) -> bool:
    """True if ``candidate`` is the next host of the range starting at ``first`` of ``length``."""
    number = int(first) + length
    return length < _MAX_RANGE and candidate == f"{number:0{len(first)}d}"


if __name__ == "__main__":  # `python -m hpcddp.launch.hostlist EXPR`: like scontrol show hostnames
    print("\n".join(expand(" ".join(sys.argv[1:]))))
