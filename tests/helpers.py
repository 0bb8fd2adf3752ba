"""Shared test helpers: run the real CLI in a subprocess, read what a run left behind, and serve
files over loopback HTTP."""

import http.server
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import urllib.parse

REPO = pathlib.Path(__file__).resolve().parents[1]

# -- the quick-run settings every test trains with ----------------------------------------------
QUICKSTART = "examples/quickstart.yaml"
# The quickstart, small: 2048 samples, one epoch (16 steps per rank at world size 4).
QUICK = [
    "data.kwargs={train_size: 2048, eval_size: 512}",
    "data.batch_size=32",
    "train.epochs=1",
]
# A Slurm job that is in one of these states has ended.
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
# A string that breaks out of careless shell quoting: it must arrive as one literal argument.
HOSTILE = "a'; touch {pwned}; '"
# Two steps of a tiny run: for tests about what happens around training, not during it.
TINY = ["data.kwargs={train_size: 256, eval_size: 64}", "train.max_steps=2"]
# For exact resume: dropout, accumulation and warmup make every RNG and counter matter.
EXACT = [
    *QUICK,
    "model.kwargs={dropout: 0.1}",
    "train.epochs=3",
    "train.grad_accum_steps=2",
    "train.log_every_steps=5",
    "optim.warmup_steps=5",
]


# Variables an outer launcher leaves behind (pytest run inside salloc or torchrun, say): a test
# that starts its own ranks must not inherit them.
_LAUNCHER_PREFIXES = ("SLURM_", "SRUN_", "SUBMITIT_", "HPCDDP_LOCAL_", "TORCHELASTIC_")
_LAUNCHER_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HPCDDP_REPORT_FILE",
)


def clear_launcher_environment(monkeypatch) -> None:
    """Remove every outer launcher's variable from this process's environment for one test."""
    for name in list(os.environ):
        if name.startswith(_LAUNCHER_PREFIXES) or name in _LAUNCHER_NAMES:
            monkeypatch.delenv(name)


def run_cli(
    *args: str, timeout: float = 300, env: dict | None = None, cwd: pathlib.Path = REPO
) -> subprocess.CompletedProcess:
    """``python -m hpcddp ARGS`` from the repository root, output captured."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hpcddp", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def train_local(run_dir, *extra: str, nproc: int = 2, config: str = QUICKSTART):
    """``hpcddp train CONFIG run.dir=RUN_DIR EXTRA --nproc N``, which must succeed."""
    result = run_cli("train", config, f"run.dir={run_dir}", *extra, "--nproc", str(nproc))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def start_local(run_dir, *extra: str, nproc: int = 2, **popen) -> subprocess.Popen:
    """``hpcddp train QUICKSTART run.dir=RUN_DIR EXTRA --nproc N``, started, not waited for."""
    command = [sys.executable, "-m", "hpcddp", "train", QUICKSTART, f"run.dir={run_dir}"]
    return subprocess.Popen([*command, *extra, "--nproc", str(nproc)], cwd=REPO, **popen)


def wait_until(predicate, what: str, timeout: float = 120) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def logged_step(run_dir: pathlib.Path) -> int:
    """The highest step a (running) run has written to metrics.jsonl so far; 0 before any."""
    metrics = pathlib.Path(run_dir) / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return max((json.loads(line).get("step", 0) for line in lines if line), default=0)


def wait_for_step(run_dir: pathlib.Path, step: int, timeout: float = 120) -> None:
    """Wait until a running job has logged ``step``."""
    wait_until(lambda: logged_step(run_dir) >= step, f"step {step} in {run_dir}", timeout)


def line_of(path: str, text: str) -> str:
    """``path:N`` of the first line of ``path`` (under the repository) that contains ``text``."""
    lines = (REPO / path).read_text().splitlines()
    return f"{path}:{next(n for n, line in enumerate(lines, 1) if text in line)}"


def summary(run_dir: pathlib.Path) -> dict:
    """The summary.json a finished run wrote."""
    return json.loads((pathlib.Path(run_dir) / "summary.json").read_text())


class LoopbackServer:
    """An HTTP server on 127.0.0.1 or another own address (a free port, in a thread) that counts
    requests per path.

    Downloads are tested against it rather than the internet: it is fast, always there, and
    the counts show how many ranks really fetched. ``content`` is either bytes, served at every
    path except those under ``/missing`` (HTTP 404, so one server covers both cases), or a
    directory whose files are served by name. Use it as a context manager, or call `close`.
    """

    def __init__(self, content: bytes | pathlib.Path, host: str = "127.0.0.1") -> None:
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._content = content
        self._httpd = http.server.ThreadingHTTPServer((host, 0), self._handler())
        self.url = f"http://{host}:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def count(self, path: str) -> int:
        """How many GET requests ``path`` (such as ``/a.bin``) has had so far."""
        with self._lock:
            return self.counts.get(path, 0)

    def close(self) -> None:
        """Stop serving and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> "LoopbackServer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _body(self, path: str) -> bytes | None:
        """What ``path`` serves; None for a 404."""
        if isinstance(self._content, bytes):
            return None if path.startswith("/missing") else self._content
        root = pathlib.Path(self._content).resolve()
        name = urllib.parse.unquote(urllib.parse.urlsplit(path).path).lstrip("/")
        file = (root / name).resolve()
        return file.read_bytes() if file.is_relative_to(root) and file.is_file() else None

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with server._lock:
                    server.counts[self.path] = server.counts.get(self.path, 0) + 1
                body = server._body(self.path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # keep test output quiet
                pass

        return Handler
