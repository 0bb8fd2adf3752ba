"""Shared test helpers: run the real CLI in a subprocess and read what a run left behind."""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_cli(*args: str, timeout: float = 300, env: dict | None = None,
            cwd: pathlib.Path = REPO) -> subprocess.CompletedProcess:
    """``python -m hpcddp ARGS`` from the repository root, output captured."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "hpcddp", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def summary(run_dir: pathlib.Path) -> dict:
    """The summary.json a finished run wrote."""
    return json.loads((pathlib.Path(run_dir) / "summary.json").read_text())
