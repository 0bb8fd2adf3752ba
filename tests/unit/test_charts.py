"""`hpcddp plot`: a PNG from metrics.jsonl, and one-line errors when it cannot be drawn."""

import argparse
import json
import logging
import math
import sys

import pytest

from hpcddp.cli import plot as plot_cli
from hpcddp.errors import HpcddpError
from hpcddp.records import charts

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_metrics(run_dir, steps: int = 200, every: int = 10, eval_every: int = 50) -> None:
    """metrics.jsonl as the trainer writes it: step lines, with eval lines in between."""
    lines = []
    for step in range(every, steps + 1, every):
        lr = 1e-3 * min(step / 50, 1.0) * (0.55 + 0.45 * math.cos(math.pi * step / steps))
        lines.append(
            {
                "step": step,
                "epoch": step // 100,
                "loss": 2.5 * math.exp(-step / 80) + 0.3,
                "lr": lr,
                "samples_per_s": 1000.0 + step % 30,
                "time_s": step * 0.05,
            }
        )
        if step % eval_every == 0:
            lines.append(
                {
                    "step": step,
                    "epoch": step // 100,
                    "eval_loss": 2.4 * math.exp(-step / 90) + 0.35,
                    "eval_accuracy": 0.5 + step / 500,
                    "time_s": step * 0.05,
                }
            )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_writes_a_png_beside_the_metrics(tmp_path):
    _write_metrics(tmp_path)
    out = charts.plot_run(tmp_path)
    assert out == tmp_path / "metrics.png"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 20_000  # three panels with lines, not an empty canvas


def test_out_path_is_honoured_and_parents_created(tmp_path):
    _write_metrics(tmp_path)
    out = charts.plot_run(tmp_path, tmp_path / "figs" / "run.png")
    assert out == tmp_path / "figs" / "run.png"
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_the_title_says_which_loss_is_the_train_one_and_which_the_evals(tmp_path):
    _write_metrics(tmp_path)
    caption = charts._caption(charts.read_metrics(tmp_path / "metrics.jsonl"))
    train = 2.5 * math.exp(-200 / 80) + 0.3
    evaluated = 2.4 * math.exp(-200 / 90) + 0.35
    assert (
        caption == f"step 200, train loss {train:.4g}, eval loss {evaluated:.4g}, eval accuracy 0.9"
    )


def test_train_lines_only_still_plot(tmp_path):
    _write_metrics(tmp_path, eval_every=10**9)
    assert charts.plot_run(tmp_path).read_bytes().startswith(PNG_MAGIC)


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    _write_metrics(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    with pytest.raises(HpcddpError) as err:
        charts.plot_run(tmp_path)
    assert "pip install 'hpcddp[plot]'" in _one_line(err)
    assert not (tmp_path / "metrics.png").exists()


def test_missing_metrics_file_is_one_line_error(tmp_path):
    with pytest.raises(HpcddpError) as err:
        charts.plot_run(tmp_path)
    message = _one_line(err)
    assert "no metrics file" in message and "HINT:" in message


@pytest.mark.parametrize("content", ["", "\n\n", '{"step": 0, "note": "nothing to plot"}\n'])
def test_empty_metrics_file_is_one_line_error(tmp_path, content):
    (tmp_path / "metrics.jsonl").write_text(content)
    with pytest.raises(HpcddpError) as err:
        charts.plot_run(tmp_path)
    assert "holds no training or eval metrics" in _one_line(err)


def test_damaged_lines_anywhere_are_skipped_and_counted(tmp_path, caplog):
    _write_metrics(tmp_path)
    path = tmp_path / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:15]  # torn in the middle (a full disk, say)
    lines.insert(5, "[1, 2, 3]")  # JSON, but not a record
    lines.append('{"step": 210, "loss": 0.')  # the write a SIGKILL interrupted
    path.write_text("\n".join(lines) + "\n\x00\x00\n")
    logger = logging.getLogger("hpcddp.records.charts")
    logger.addHandler(caplog.handler)  # an in-process Trainer.fit may stop propagation
    try:
        assert charts.read_metrics(path).skipped == 4
        assert charts.plot_run(tmp_path).read_bytes().startswith(PNG_MAGIC)
    finally:
        logger.removeHandler(caplog.handler)
    assert "skipped 4 damaged line(s)" in caplog.text


def test_resumes_and_the_per_rank_spread_are_read_for_drawing(tmp_path):
    _write_metrics(tmp_path)
    path = tmp_path / "metrics.jsonl"
    extra = [
        {"step": 60, "event": "resumed", "slurm_restart_count": "1"},
        {"step": 150, "event": "resumed", "slurm_restart_count": "2"},
        {"step": 160, "loss": 0.5, "step_time_s": 0.4, "work_s_min": 0.09,
         "work_s_median": 0.1, "work_s_max": 0.4, "slowest_rank": 3, "slowest_host": "n2"},
    ]  # fmt: skip
    with path.open("a") as f:
        f.writelines(json.dumps(record) + "\n" for record in extra)
    metrics = charts.read_metrics(path)
    assert metrics.resumes == [60, 150]
    assert charts._series(metrics.train, "work_s_max") == ([160], [0.4])
    assert charts._eval_keys(metrics.evals) == ["eval_accuracy"]
    assert "2 resume(s)" in charts._caption(metrics)
    assert charts.plot_run(tmp_path).read_bytes().startswith(PNG_MAGIC)


def test_subcommand_parses_runs_and_prints_the_path(tmp_path, capsys):
    _write_metrics(tmp_path)
    parser = argparse.ArgumentParser(prog="hpcddp")
    plot_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "custom.png"
    args = parser.parse_args(["plot", str(tmp_path), "--out", str(out)])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_subcommand_default_out(tmp_path, capsys):
    _write_metrics(tmp_path)
    parser = argparse.ArgumentParser(prog="hpcddp")
    plot_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plot", str(tmp_path)])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "metrics.png")


# -- a sweep ----------------------------------------------------------------------------------


def _sweep(tmp_path, logged=(0, 1)):
    from hpcddp.records import sweep_manifest

    points = []
    for index, lr in enumerate((0.001, 0.003, 0.01)):
        run_dir = tmp_path / f"{index}-optim.lr={lr}"
        run_dir.mkdir()
        if index in logged:
            _write_metrics(run_dir, steps=100 * (index + 1))
        points.append(sweep_manifest.Point(index, {"optim.lr": lr}, str(run_dir)))
    grid = {"optim.lr": [0.001, 0.003, 0.01]}
    sweep_manifest.write(tmp_path, sweep_manifest.Manifest(grid, tuple(points)))


def test_a_sweep_overlays_its_points_labelled_by_grid_values(tmp_path, capsys):
    _sweep(tmp_path)
    assert plot_cli.cmd_plot(argparse.Namespace(run_dir=str(tmp_path), out=None)) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(tmp_path / "sweep.png")
    assert captured.err.strip() == "hpcddp: no metrics yet for lr=0.01"
    data = (tmp_path / "sweep.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000


def test_the_sweep_plot_draws_one_labelled_line_per_point_and_panel(tmp_path, monkeypatch):
    drawn = {}
    real = charts._pyplot

    def spying():
        plt = real()
        original = plt.subplots

        def subplots(*args, **kwargs):
            fig, axes = original(*args, **kwargs)
            drawn["axes"] = axes[:, 0]
            return fig, axes

        monkeypatch.setattr(plt, "subplots", subplots)
        return plt

    monkeypatch.setattr(charts, "_pyplot", spying)
    curves = [("lr=0.001", tmp_path / "a"), ("lr=0.003", tmp_path / "b")]
    for _, run_dir in curves:
        run_dir.mkdir()
        _write_metrics(run_dir)
    charts.plot_sweep(curves, tmp_path / "out.png", "sweep")
    panels = [(ax.get_ylabel(), [line.get_label() for line in ax.lines]) for ax in drawn["axes"]]
    assert panels == [
        ("train loss", ["lr=0.001", "lr=0.003"]),
        ("eval_loss", ["lr=0.001", "lr=0.003"]),
        ("eval_accuracy", ["lr=0.001", "lr=0.003"]),
    ]


def test_a_sweep_with_nothing_logged_is_one_line(tmp_path):
    _sweep(tmp_path, logged=())
    with pytest.raises(HpcddpError) as err:
        plot_cli.cmd_plot(argparse.Namespace(run_dir=str(tmp_path), out=None))
    assert "no point of the sweep has logged a step yet (3 points)" in _one_line(err)
