"""``hpcddp plot RUN_DIR|SWEEP_DIR``: the figures people look at, from metrics.jsonl, as one PNG.

Panels: loss (train and eval), the other eval metrics (accuracy, perplexity, MSE...),
throughput (samples/s, tokens/s), the step time and the spread of each rank's own work per
step (fastest, median, slowest rank: a wide band is a slow node). Every attempt that resumed
after a preemption or a requeue is a dashed vertical line. A sweep's points share the axes
instead, one line each, labelled by their grid values (`plot_sweep`). Damaged lines (a run killed
mid-write, a full disk) are skipped and counted, never fatal. matplotlib is an optional extra
(``pip install 'hpcddp[plot]'``), imported only when a plot is drawn, on the Agg backend.
"""

import dataclasses
import json
import logging
import pathlib
from collections.abc import Sequence
from typing import Any

from hpcddp.errors import HpcddpError
from hpcddp.run_files import METRICS_PNG, metrics_path

log = logging.getLogger(__name__)


class PlotError(HpcddpError):
    """The metrics cannot be read or the plot cannot be drawn."""


@dataclasses.dataclass
class Metrics:
    """What metrics.jsonl holds, sorted into the lines each panel draws."""

    train: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    resumes: list[int]  # steps where a later attempt took over
    skipped: int  # damaged lines left out


def read_metrics(path: pathlib.Path) -> Metrics:
    """metrics.jsonl as `Metrics`; damaged lines are skipped and counted (with a warning)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        raise PlotError(
            f"no metrics file at {path}. HINT: pass the run directory (run.dir) of "
            "a run that logged at least one step."
        ) from None
    records, skipped = [], 0
    for line in filter(str.strip, lines):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("step"), (int, float)):
            records.append(record)
        else:
            skipped += 1
    if skipped:
        log.warning("%s: skipped %d damaged line(s)", path, skipped)
    metrics = Metrics(
        train=[r for r in records if "loss" in r],
        evals=[r for r in records if "eval_loss" in r or _eval_keys([r])],
        resumes=sorted({int(r["step"]) for r in records if r.get("event") == "resumed"}),
        skipped=skipped,
    )
    if not metrics.train and not metrics.evals:
        raise PlotError(
            f"{path} holds no training or eval metrics ({skipped} damaged line(s) skipped). "
            "HINT: plot after the run has logged a step (train.log_every_steps)."
        )
    return metrics


def _eval_keys(records: list[dict[str, Any]]) -> list[str]:
    """Eval metrics other than the loss, in the order they first appear."""
    keys: dict[str, None] = {}
    for record in records:
        keys.update((k, None) for k in record if k.startswith("eval_") and k != "eval_loss")
    return list(keys)


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) for the records that carry a number under ``key``."""
    pairs = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or a one-line error naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(
            "plotting needs matplotlib, which is not installed. "
            "HINT: pip install 'hpcddp[plot]' (or pip install matplotlib)."
        ) from None
    return plt


def _draw_loss(ax: Any, m: Metrics) -> None:
    ax.plot(*_series(m.train, "loss"), label="train", linewidth=1)
    ax.plot(*_series(m.evals, "eval_loss"), "o-", label="eval", markersize=3)
    ax.set_ylabel("loss")
    ax.legend()


def _draw_eval(ax: Any, m: Metrics) -> None:
    for key in _eval_keys(m.evals):
        ax.plot(*_series(m.evals, key), "o-", label=key.removeprefix("eval_"), markersize=3)
    ax.set_ylabel("eval metrics")
    if ax.lines:
        ax.legend()


def _draw_throughput(ax: Any, m: Metrics) -> None:
    ax.plot(*_series(m.train, "samples_per_s"), color="tab:purple", label="samples/s")
    if any("tokens_per_s" in r for r in m.train):
        ax.twinx().plot(*_series(m.train, "tokens_per_s"), color="tab:olive", label="tokens/s")
    ax.set_ylabel("samples/s")


def _draw_spread(ax: Any, m: Metrics) -> None:
    steps, low = _series(m.train, "work_s_min")
    _, high = _series(m.train, "work_s_max")
    if steps and len(low) == len(high):
        ax.fill_between(steps, low, high, alpha=0.3, label="own work: fastest to slowest rank")
    ax.plot(*_series(m.train, "work_s_median"), color="tab:orange", label="own work: median rank")
    ax.plot(*_series(m.train, "step_time_s"), color="tab:red", label="step time")
    ax.set_ylabel("seconds per step")
    if ax.lines:
        ax.legend()


PANELS = (_draw_loss, _draw_eval, _draw_throughput, _draw_spread)


def plot_run(run_dir: str | pathlib.Path, out: str | pathlib.Path | None = None) -> pathlib.Path:
    """Draw RUN_DIR/metrics.jsonl into a PNG (default RUN_DIR/metrics.png); return its path."""
    run_dir = pathlib.Path(run_dir)
    metrics = read_metrics(metrics_path(run_dir))
    plt = _pyplot()
    out = pathlib.Path(out) if out else run_dir / METRICS_PNG
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(8, 11), sharex=True)
    try:
        for ax, draw in zip(axes, PANELS, strict=True):
            draw(ax, metrics)
            for step in metrics.resumes:
                ax.axvline(step, color="grey", linestyle="--", linewidth=0.8)
            ax.grid(alpha=0.3)
        axes[-1].set_xlabel("optimizer step (dashed: resumed after a stop)")
        fig.suptitle(f"{run_dir.resolve().name}: {_caption(metrics)}")
        _save(fig, out)
    finally:
        plt.close(fig)
    return out


def _caption(m: Metrics) -> str:
    """The headline numbers: last step, the train loss, the last eval metrics (each says it is
    the eval's: "train loss 0.19, eval loss 0.22"), and what was skipped."""
    parts = [f"step {max(r['step'] for r in m.train + m.evals)}"]
    if m.train:
        parts.append(f"train loss {m.train[-1]['loss']:.4g}")
    if m.evals:
        last = m.evals[-1]
        parts += [f"{k.replace('_', ' ', 1)} {last[k]:.4g}" for k in last if k.startswith("eval_")]
    if m.resumes:
        parts.append(f"{len(m.resumes)} resume(s)")
    if m.skipped:
        parts.append(f"{m.skipped} damaged line(s) skipped")
    return ", ".join(parts)


# -- a sweep: every point's curves on the same axes ---------------------------------------------


def plot_sweep(
    curves: Sequence[tuple[str, pathlib.Path]], out: pathlib.Path, title: str
) -> tuple[pathlib.Path, list[str]]:
    """Overlay each point's train loss and eval curves, one line per point labelled ``label``.

    ``curves`` are (label, run directory) pairs. Returns the PNG's path and the labels of the
    points left out for having logged nothing yet (pending, or failed before a step).
    """
    loaded, missing = [], []
    for label, run_dir in curves:
        try:
            loaded.append((label, read_metrics(metrics_path(run_dir))))
        except PlotError:
            missing.append(label)
    if not loaded:
        raise PlotError(
            f"no point of the sweep has logged a step yet ({len(missing)} points). "
            "HINT: `hpcddp status SWEEP_DIR` says where they stand; plot once they run."
        )
    evals = [key for _, m in loaded for key in _eval_keys(m.evals)]
    keys = ["loss", "eval_loss", *dict.fromkeys(evals)]
    plt = _pyplot()
    fig, axes = plt.subplots(len(keys), 1, figsize=(8, 2.8 * len(keys)), sharex=True, squeeze=False)
    try:
        for ax, key in zip(axes[:, 0], keys, strict=True):
            for number, (label, metrics) in enumerate(loaded):
                records, style = (metrics.train, "-") if key == "loss" else (metrics.evals, "o-")
                ax.plot(
                    *_series(records, key),
                    style,
                    color=f"C{number % 10}",
                    label=label,
                    linewidth=1,
                    markersize=3,
                )
            ax.set_ylabel(key if key != "loss" else "train loss")
            ax.grid(alpha=0.3)
        axes[0, 0].legend(fontsize="small")
        axes[-1, 0].set_xlabel("optimizer step")
        fig.suptitle(title + (f" ({len(missing)} point(s) with no metrics yet)" if missing else ""))
        _save(fig, out)
    finally:
        plt.close(fig)
    return out, missing


def _save(fig: Any, out: pathlib.Path) -> None:
    """Lay the figure out and write it; an unwritable ``out`` is one line with its fix."""
    fig.tight_layout()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    except OSError as err:
        raise PlotError(
            f"could not write {out}: {err.strerror}. HINT: pass --out <a writable path>."
        ) from None
