"""No class in hpcddp/ over 200 lines: a class that builds, runs, decides and reports is four."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "hpcddp"
MAX_LINES = 200


def classes_over(limit: int, root: pathlib.Path = PACKAGE) -> list[str]:
    """``path:line Name (N lines)`` for every class longer than ``limit`` lines under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} "
                                 f"({lines} lines)")  # fmt: skip
    return found


def test_no_class_in_hpcddp_is_over_200_lines():
    assert classes_over(MAX_LINES) == []


def test_the_check_sees_a_long_class(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "big.py").write_text(f"class Big:\n{body}\n\nclass Small:\n    y = 1\n")
    assert classes_over(MAX_LINES, tmp_path) == [f"{tmp_path.name}/big.py:1 Big (201 lines)"]
