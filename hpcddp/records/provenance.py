"""What code a run ran: git commit, dirty flag and diff, and the versions of what it imports.

``RUN_DIR/provenance.json`` describes the latest attempt; each git tree involved (the working
directory's, the factories', hpcddp's own when installed from a checkout) gets its commit, a
dirty flag and, when dirty, its diff in ``RUN_DIR/provenance/<tree>.diff``. When a resumed
attempt runs other code or other versions, the previous description is kept beside it
(``provenance-<n>.json``) and `differences` says what changed, for a one-line warning.

Torch-free: versions come from the installed distributions' metadata.
"""

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import pathlib
import platform
import subprocess
from collections.abc import Iterable
from typing import Any

from hpcddp import run_files
from hpcddp.storage.atomic import atomic_write_text

log = logging.getLogger(__name__)

FILE = run_files.PROVENANCE
MAX_DIFF_BYTES = 8 << 20  # a diff bigger than this is summarized, not stored
DISTRIBUTIONS = ("torch", "hpcddp", "numpy")


def _git(folder: pathlib.Path, *args: str) -> str | None:
    """``git -C folder ARGS``'s output, or None when git or the tree is not there."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode(errors="replace") if done.returncode == 0 else None


def module_folder(spec: str) -> pathlib.Path | None:
    """The folder of a factory's module (``pkg.mod:fn``), without importing it when possible."""
    name = spec.split(":")[0]
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(found, "origin", None)
    return pathlib.Path(origin).parent if origin and origin != "built-in" else None


def trees(folders: Iterable[pathlib.Path | None]) -> list[pathlib.Path]:
    """The distinct git working trees that hold ``folders``, in order."""
    found: dict[str, pathlib.Path] = {}
    for folder in folders:
        if folder is None or not folder.is_dir():
            continue
        top = _git(folder, "rev-parse", "--show-toplevel")
        if top and top.strip() not in found:
            found[top.strip()] = pathlib.Path(top.strip())
    return list(found.values())


def describe_tree(top: pathlib.Path) -> dict[str, Any]:
    """Commit, dirty flag, diff (against the commit, staged or not) and untracked files."""
    diff = _git(top, "diff", "HEAD", "--binary") or ""
    untracked = (_git(top, "ls-files", "--others", "--exclude-standard") or "").splitlines()
    return {
        "path": str(top),
        "commit": (_git(top, "rev-parse", "HEAD") or "").strip(),
        "dirty": bool(diff or untracked),
        "diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else "",
        "diff": diff,
        "untracked": untracked[:200],
    }


def versions() -> dict[str, str]:
    """Python and the installed versions of the distributions a run's results depend on."""
    found = {"python": platform.python_version()}
    for name in DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = ""
    return found


def collect(factories: Iterable[str] = ()) -> dict[str, Any]:
    """This process's provenance: its git trees and versions (diffs inline, for `record`)."""
    folders: list[pathlib.Path | None] = [pathlib.Path.cwd()]
    folders.append(pathlib.Path(__file__).resolve().parents[1])
    folders += [module_folder(spec) for spec in factories if spec]
    return {"trees": [describe_tree(t) for t in trees(folders)], "versions": versions()}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``torch 2.12.0 -> 2.13.0``, ``/src/proj: commit 1a2b3c -> 4d5e6f``, ... (what changed)."""
    changes = []
    for name, version in new.get("versions", {}).items():
        before = old.get("versions", {}).get(name)
        if before is not None and before != version:
            changes.append(f"{name} {before} -> {version}")
    before_trees = {t["path"]: t for t in old.get("trees", [])}
    for tree in new.get("trees", []):
        was = before_trees.get(tree["path"])
        if was is None:
            continue
        if was["commit"] != tree["commit"]:
            changes.append(f"{tree['path']}: commit {was['commit'][:10]} -> {tree['commit'][:10]}")
        elif was.get("diff_sha256") != tree.get("diff_sha256"):
            changes.append(f"{tree['path']}: uncommitted changes differ")
    return changes


def load(run_dir: pathlib.Path) -> dict[str, Any] | None:
    """The provenance the last attempt recorded (None when there is none; ValueError if damaged)."""
    try:
        loaded: dict[str, Any] = json.loads((run_dir / FILE).read_text())
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ValueError(str(err)) from None
    return loaded


def record(run_dir: pathlib.Path, found: dict[str, Any], changed: bool = False) -> None:
    """Write ``found`` as the run's provenance; with ``changed``, keep the previous one beside."""
    path = run_dir / FILE
    if changed and path.exists():
        kept = len(list(run_dir.glob("provenance-*.json"))) + 1
        os.replace(path, run_dir / f"provenance-{kept}.json")
    folder = run_dir / "provenance"
    stored = []
    for index, tree in enumerate(found["trees"]):
        entry = {k: v for k, v in tree.items() if k != "diff"}
        if tree["diff"]:
            name = f"{index}-{pathlib.Path(tree['path']).name}.diff"
            folder.mkdir(exist_ok=True)
            text = tree["diff"]
            if len(text) > MAX_DIFF_BYTES:
                text = f"(diff of {len(text)} bytes not stored; sha256 {tree['diff_sha256']})\n"
            if not (folder / name).exists() or (folder / name).read_text() != text:
                atomic_write_text(folder / name, text)
            entry["diff_file"] = f"provenance/{name}"
        stored.append(entry)
    text = json.dumps({**found, "trees": stored}, indent=2) + "\n"
    if (
        not path.exists() or path.read_text() != text
    ):  # an attempt that changes nothing writes nothing
        atomic_write_text(path, text)
