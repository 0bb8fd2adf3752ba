"""The house's layout is a checked contract: wings by world, and no torch on the login side.

import-linter checks the layers and the forbidden imports (its contracts live in
pyproject.toml); these tests show that the contract holds, that it bites when broken, and
that the login-side commands really start without torch in a fresh interpreter.
"""

import ast
import pathlib
import shutil
import subprocess
import sys
import tomllib

import pytest

from hpcddp.launch import gpus
from hpcddp.records import sweep_manifest
from tests.fixtures.helpers import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CONTRACTS = PYPROJECT["tool"]["importlinter"]["contracts"]
LOGIN_SIDE = ("hpcddp.config", "hpcddp.launch", "hpcddp.slurm", "hpcddp.cli")


def lint_imports(root: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package found in ``root`` (it puts its working directory first)."""
    return subprocess.run(
        [str(pathlib.Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_keeps_every_contract():
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


def test_torch_at_the_top_of_submission_breaks_the_contract(tmp_path):
    shutil.copytree(REPO / "hpcddp", tmp_path / "hpcddp")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    assert lint_imports(tmp_path).returncode == 0  # the copy alone is fine
    submission = tmp_path / "hpcddp" / "slurm" / "submission.py"
    submission.write_text("import torch\n" + submission.read_text())
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert "The login side never imports torch at module level BROKEN" in done.stdout
    assert "hpcddp.slurm.submission -> torch" in done.stdout


def test_no_package_has_a_name_that_tools_skip():
    """``dist``/``build`` are dropped by common .gitignore templates and skipped by ruff's default
    excludes: a package so named is silently left out of commits and lint (it happened)."""
    skipped = {"dist", "build", "site-packages", "node_modules", "__pypackages__", "_build"}
    packages = {p.parent.name for p in (REPO / "hpcddp").rglob("__init__.py")}
    assert not packages & skipped


def test_the_layers_are_the_wings_in_order():
    layers = next(c for c in CONTRACTS if c["type"] == "layers")
    wings = ["cli", "slurm", "check : train", "comm : records", "storage", "notify", "launch"]
    assert layers["layers"][:7] == wings
    forbidden = next(c for c in CONTRACTS if c["type"] == "forbidden")
    assert set(LOGIN_SIDE) <= set(forbidden["source_modules"])
    assert "torch" in forbidden["forbidden_modules"]


def _imported_at_module_level(source: str, target: str) -> list[int]:
    """Lines where ``source``'s module body (not a function) imports ``target`` or below it."""
    tree = ast.parse(pathlib.Path(REPO, *source.split(".")).with_suffix(".py").read_text())
    inside_functions = {
        id(node)
        for func in ast.walk(tree)
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(func)
    }
    lines = []
    for node in ast.walk(tree):
        if id(node) in inside_functions:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        if any(n == target or n.startswith(target + ".") for n in names):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize(
    "ignored",
    [i for c in CONTRACTS for i in c.get("ignore_imports", [])],
)
def test_every_ignored_import_happens_inside_a_function(ignored):
    """The contract may overlook an import only because it runs when a function is called."""
    source, target = (part.strip() for part in ignored.split("->"))
    assert _imported_at_module_level(source, target) == [], f"{ignored} is at module level"
    body = pathlib.Path(REPO, *source.split(".")).with_suffix(".py").read_text()
    spellings = (f"import {target.split('.')[-1]}", f"from {target} import", f"from {target}.")
    assert any(spelling in body for spelling in spellings)


TORCH_FREE_CHECK = """
import sys
from hpcddp.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:  # argparse's --help ends this way
    code = stop.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "numpy", "submitit"})
print("EXIT:" + str(code or 0))
print("HEAVY:" + ",".join(heavy))
"""

# scontrol as a controller that knows job 123, so `status` and `logs` take their success path
# (and its imports) instead of stopping at "scontrol did not answer".
FAKE_SCONTROL = """#!/bin/sh
echo "JobId=123 JobName=hpcddp JobState=RUNNING NodeList=n1 StdOut=$0.out StdErr=$0.out"
"""


@pytest.mark.parametrize(
    "argv, allowed",
    [
        (["submit", "--help"], set()),
        (["status", "123"], set()),
        (["logs", "123"], set()),
        (["sbatch", "--help"], set()),
        (["sbatch", "examples/quickstart.yaml", "--dry-run"], set()),
        (["train", "--help-config"], set()),
        (["plot", "--help"], set()),
        (["sweep", "--help"], set()),
        (["status", "SWEEP_DIR"], set()),
        (["report", "--help"], set()),
        (["env"], {"torch", "numpy"} if gpus.has_gpu_device_files() else set()),  # a GPU node's
    ],
)
def test_login_commands_start_without_torch(argv, allowed, tmp_path):
    if "SWEEP_DIR" in argv:  # a sweep of one point, submitted as job 123
        task = sweep_manifest.Task(0, "123_0", f"{tmp_path}/o", f"{tmp_path}/e")
        array = sweep_manifest.Array("123", "slurm", 0.0, (task,))
        point = sweep_manifest.Point(0, {"optim.lr": 0.1}, str(tmp_path))
        manifest = sweep_manifest.Manifest({"optim.lr": [0.1]}, (point,), (array,))
        argv = [str(sweep_manifest.write(tmp_path, manifest).parent) if a == "SWEEP_DIR" else a
                for a in argv]  # fmt: skip
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(FAKE_SCONTROL)
    scontrol.chmod(0o755)
    pathlib.Path(f"{scontrol}.out").write_text("the job's output\n")
    env = {"HPCDDP_JOBS_DIR": str(tmp_path), "PATH": str(tmp_path)}  # no Slurm but scontrol
    done = subprocess.run(
        [sys.executable, "-c", TORCH_FREE_CHECK, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    *_, exit_line, heavy = done.stdout.strip().splitlines()
    assert exit_line == "EXIT:0", f"`hpcddp {' '.join(argv)}` failed:\n{done.stderr[-2000:]}"
    assert heavy.startswith("HEAVY:"), done.stderr
    assert set(filter(None, heavy[len("HEAVY:") :].split(","))) <= allowed, done.stdout


def test_every_login_side_module_imports_without_torch():
    modules = sorted(
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for package in LOGIN_SIDE
        for path in (REPO / package.replace(".", "/")).rglob("*.py")
    )
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "False", done.stderr
