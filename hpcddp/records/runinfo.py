"""What a run directory says about its run, for ``hpcddp status RUN_DIR`` on the login node.

The latest figures (step, loss, throughput, the slowest rank and its host), the latest eval
metrics, how often the run resumed, whether a process holds it now, and whether it finished.
Read from the files alone (no Slurm, no torch); a damaged file is reported in its line.
"""

import json
import pathlib
from typing import Any

from hpcddp.errors import ConfigError
from hpcddp.run_files import CONFIG, METRICS, DamagedSummary, read_summary
from hpcddp.storage.runlock import holder

# metrics.jsonl keys shown by `hpcddp status`, in this order, when the latest line has them
FIGURES = (
    "loss",
    "lr",
    "samples_per_s",
    "tokens_per_s",
    "step_time_s",
    "slowest_rank",
    "slowest_host",
    "slowest_vs_median",
    "data_wait_s",
    "rss_gb_max",
    "cuda_gb_max",
    "tflops_per_device",
    "mfu",
)


def jsonl_records(path: pathlib.Path) -> tuple[list[dict[str, Any]], int]:
    """The readable records of a JSON-lines file, and how many lines were not."""
    records, damaged = [], 0
    for line in filter(str.strip, path.read_text(errors="replace").splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            damaged += 1
    return records, damaged


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run_lines(run_dir: pathlib.Path) -> list[str]:
    """``key: value`` lines describing the run in ``run_dir``."""
    if not (run_dir / CONFIG).exists() and not (run_dir / METRICS).exists():
        raise ConfigError(
            f"{run_dir} is not a run directory (no {CONFIG} or {METRICS}). "
            "HINT: pass the run's run.dir, or a Slurm job id."
        )
    rows: list[tuple[str, str]] = [("run dir", str(run_dir))]
    lock = holder(run_dir)
    rows.append(("held by", _holder(lock) if lock else "nobody (not running now)"))
    metrics = run_dir / METRICS
    records, damaged = jsonl_records(metrics) if metrics.exists() else ([], 0)
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if any(k.startswith("eval_") for k in r)]
    if train:
        latest = train[-1]
        rows.append(("step", f"{latest.get('step')} (epoch {latest.get('epoch', '?')})"))
        rows += [(key, _value(latest[key])) for key in FIGURES if key in latest]
    if evals:
        rows += [(k, _value(v)) for k, v in evals[-1].items() if k.startswith("eval_")]
    resumes = sum(1 for r in records if r.get("event") == "resumed")
    rows.append(("resumed", f"{resumes} time(s)"))
    if damaged:
        rows.append((METRICS, f"{damaged} damaged line(s) skipped"))
    rows.append(("finished", _finished(run_dir)))
    return [f"{key + ':':<18}{value}" for key, value in rows]


def _finished(run_dir: pathlib.Path) -> str:
    """ "yes", "no", or why the run ended without finishing (a non-finite loss, say)."""
    try:
        summary = read_summary(run_dir)
    except DamagedSummary as err:
        return f"damaged ({err})"
    if summary is None:
        return "no"
    if summary.failed:
        return f"no: failed at step {summary.steps} ({summary.reason or '?'})"
    return "yes"


def _holder(lock: dict[str, Any]) -> str:
    parts = [f"{k} {lock[k]}" for k in ("host", "pid", "job_id") if lock.get(k)]
    return ", ".join(parts) + (f", since {lock['since']}" if lock.get("since") else "")
