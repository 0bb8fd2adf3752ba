"""Size alarms for hpcddp/: no class over 200 lines, no function with more than 6 parameters.

They are alarms, not targets: a class that builds, runs, decides and reports is four, and a
side concern of the training loop is a hook (`hpcddp.train.hooks`), not lines in the loop. A
function that needs more than six values takes the object that holds them.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "hpcddp"
MAX_LINES = 200
MAX_PARAMETERS = 6  # self and cls not counted; *args and **kwargs count one each


def _nodes(root: pathlib.Path):
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            yield path.relative_to(root.parent), node


def classes_over(limit: int, root: pathlib.Path = PACKAGE) -> list[str]:
    """``path:line Name (N lines)`` for every class longer than ``limit`` lines under ``root``."""
    found = []
    for where, node in _nodes(root):
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """How many values a caller may pass: every parameter but a method's self or cls."""
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (args.vararg is not None) + (args.kwarg is not None)


def functions_over(limit: int, root: pathlib.Path = PACKAGE) -> list[str]:
    """``path:line name (N parameters)`` for every function taking more than ``limit``."""
    return [
        f"{where}:{node.lineno} {node.name} ({parameters(node)} parameters)"
        for where, node in _nodes(root)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and parameters(node) > limit
    ]


def test_no_class_in_hpcddp_is_over_200_lines():
    assert classes_over(MAX_LINES) == []


def test_no_function_in_hpcddp_takes_more_than_6_parameters():
    assert functions_over(MAX_PARAMETERS) == []


def test_the_check_sees_a_long_class(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "big.py").write_text(f"class Big:\n{body}\n\nclass Small:\n    y = 1\n")
    assert classes_over(MAX_LINES, tmp_path) == [f"{tmp_path.name}/big.py:1 Big (201 lines)"]


def test_the_check_counts_parameters_as_a_caller_passes_them(tmp_path):
    (tmp_path / "calls.py").write_text(
        "def seven(a, b, c, d, e, f, g): pass\n"
        "def six(a, b, c, d, e, f): pass\n"
        "def keywords(a, b, c, d, e, *, f, g): pass\n"
        "def rest(a, b, c, d, e, *more, **named): pass\n"
        "class C:\n"
        "    def method(self, a, b, c, d, e, f): pass\n"
        "    async def later(self, a, b, c, d, e, f, g): pass\n"
    )
    assert functions_over(MAX_PARAMETERS, tmp_path) == [
        f"{tmp_path.name}/calls.py:1 seven (7 parameters)",
        f"{tmp_path.name}/calls.py:3 keywords (7 parameters)",
        f"{tmp_path.name}/calls.py:4 rest (7 parameters)",
        f"{tmp_path.name}/calls.py:7 later (7 parameters)",
    ]
