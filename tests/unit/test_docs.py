"""What the documentation promises about itself: the README is a front page with a map of
``docs/``, the pages link to each other correctly, sample output shows no developer's machine,
and every command the README shows is one a test runs.
"""

import ast
import re
import shlex
from collections.abc import Iterator

from tests.fixtures.helpers import REPO

README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
# Pages another branch brings, linked from the map before they land: a link to one is checked
# once it exists.
PROMISED = {"docs/fsdp.md"}
# Paths that only exist on the machine a sample output was copied from: a checkout under /work,
# a home directory, pytest's or tempfile's temporary directories.
MACHINE_PATH = re.compile(
    r"/work/|/root/|/home/\w|/Users/\w|/tmp/pytest-of-|/tmp/tmp\w{4}|/private/var/folders/"
)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text with its fenced code blocks blanked (line numbers kept)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page) -> set[str]:
    return {_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", _prose(page.read_text()), re.M)}


# -- the README is a front page --------------------------------------------------------------


def test_the_readme_fits_in_250_lines():
    lines = README.read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines. HINT: move the detail into a docs/ page"


def test_the_readme_maps_every_docs_page():
    linked = {target.split("#")[0] for target in LINK.findall(README.read_text())}
    unmapped = [p.name for p in PAGES if f"docs/{p.name}" not in linked]
    assert not unmapped, f"README.md's map does not link {unmapped}"


# -- the pages hold together -------------------------------------------------------------------


def _links() -> Iterator[tuple[str, int, str]]:
    """(page, line, target) for every relative link outside code blocks."""
    for page in [README, *PAGES]:
        prose = _prose(page.read_text())
        for link in LINK.finditer(prose):  # a link's text may wrap onto the next line
            if not re.match(r"[a-z]+:", target := link.group(1)):
                number = prose.count("\n", 0, link.start()) + 1
                yield str(page.relative_to(REPO)), number, target


def test_every_link_between_pages_reaches_a_file_and_a_heading():
    broken = []
    for page, number, target in _links():
        path, _, fragment = target.partition("#")
        file = (REPO / page).parent / path if path else REPO / page
        if not file.exists() and str(file.resolve().relative_to(REPO)) in PROMISED:
            continue
        if not file.exists():
            broken.append(f"{page}:{number}: {target}: no such file")
        elif fragment and fragment not in _anchors(file):
            broken.append(f"{page}:{number}: {target}: no heading #{fragment} there")
    assert not broken, "\n".join(broken)


def test_sample_output_shows_no_machine_specific_paths():
    found = [
        f"{page.relative_to(REPO)}:{number}: {line.strip()[:120]}"
        for page in [README, *PAGES]
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert not found, (
        "paths from one machine in the docs:\n"
        + "\n".join(found)
        + "\nHINT: write a neutral path (runs/x, /scratch/project/runs/x) in sample output"
    )


# -- every command the README shows is run by a test -------------------------------------------


def _words_of_shell(command: str) -> list[str]:
    return shlex.split(command, comments=True)


def _words_of_python(code: str) -> list[list[str]]:
    """Per call: its dotted name, its string arguments (list items too), its keyword=constant."""
    calls = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and (name := _dotted(node.func)) != "print":
            words = [name]
            for arg in node.args:
                elements = arg.elts if isinstance(arg, ast.List) else [arg]
                words += [e.value for e in elements if isinstance(e, ast.Constant)]
            words += [f"{k.arg}={k.value.value!r}" for k in node.keywords if _constant(k.value)]
            calls.append([str(w) for w in words])
    return calls


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _constant(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant)


def readme_commands() -> Iterator[tuple[str, list[str]]]:
    """(what the README shows, the words a test must use) for every command in its code blocks.

    A shell line's setup (``python3 -m venv ... && pip install ...``) is left to
    ``test_the_readmes_setup_is_what_ci_runs``; its last command is what a test must run.
    """
    for language, block in FENCE.findall(README.read_text()):
        if language == "python":
            for words in _words_of_python(block):
                yield f"{words[0]}(...) in README.md", words
        elif language == "bash":
            for line in filter(str.strip, block.splitlines()):
                yield line, _words_of_shell(line.split("&&")[-1])


def _string_parts(node: ast.AST) -> Iterator[str]:
    """String constants, the fixed parts of f-strings, and paths joined with ``/``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub.value
        elif isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div):
            parts, left = [], sub
            while isinstance(left, ast.BinOp) and isinstance(left.op, ast.Div):
                parts.insert(0, left.right)
                left = left.left
            names = [p.value for p in parts if isinstance(p, ast.Constant)]
            if names and all(isinstance(n, str) for n in names):
                yield "/".join(names)
        elif isinstance(sub, ast.Call):
            yield _dotted(sub.func)
            if _dotted(sub.func) == "run_cli":  # python -m hpcddp ...
                yield "hpcddp"
            yield from (f"{k.arg}={k.value.value!r}" for k in sub.keywords if _constant(k.value))


def _test_function_words() -> dict[str, set[str]]:
    """Every test function's words (its module's constants included), by node id."""
    found = {}
    for file in sorted(REPO.glob("tests/*/test_*.py")):
        if file.name == "test_docs.py":  # this file quotes the README; it runs none of it
            continue
        tree = ast.parse(file.read_text())
        constants = {w for n in tree.body if isinstance(n, ast.Assign) for w in _string_parts(n)}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                node_id = f"{file.relative_to(REPO)}::{node.name}"
                found[node_id] = constants | set(_string_parts(node))
    return found


def _used(word: str, words: set[str]) -> bool:
    """A test uses a README word: the same word; for a placeholder (JOBID), anything; for a
    ``key=value`` override, the same key (tests write their own paths)."""
    if re.fullmatch(r"[A-Z][A-Z_]+", word):
        return True
    key = re.match(r"([a-z_]+(?:\.[a-z_]+)+=)", word)
    return word in words or bool(key and any(w.startswith(key.group(1)) for w in words))


def covering_tests(words: list[str], tests: dict[str, set[str]]) -> list[str]:
    return [node_id for node_id, have in tests.items() if all(_used(w, have) for w in words)]


def test_every_command_the_readme_shows_is_run_by_a_test():
    tests = _test_function_words()
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    lonely = []
    for shown, words in readme_commands():
        if shown in ci or covering_tests(words, tests):
            continue
        nearest = max(tests, key=lambda t: sum(_used(w, tests[t]) for w in words))
        missing = [w for w in words if not _used(w, tests[nearest])]
        lonely.append(f"{shown}\n    nearest: {nearest}, which never uses {missing}")
    assert not lonely, "README commands no test runs:\n" + "\n".join(lonely)


def test_the_readmes_setup_is_what_ci_runs():
    """The first command installs what the second does, without the test extras: CI runs the
    second verbatim (test_repository), so both set-ups are exercised."""
    block = FENCE.search(README.read_text()).group(2)
    first, second = (line.rsplit("&&", 1)[0] for line in block.splitlines()[:2])
    assert first == second.replace(" --no-compile", "").replace("'.[test]'", "."), (
        "the README's first command sets up otherwise than its second, which CI runs"
    )
