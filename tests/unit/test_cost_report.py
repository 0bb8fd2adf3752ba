"""``hpcddp report``: a run's cost per attempt from stand-in records (what rank 0 and the job
script's helper write), Slurm's accounting beside it where ``sacct`` answers, and a sweep's
runs added up."""

import datetime
import json
import subprocess

import pytest

from hpcddp.cli.main import main
from hpcddp.records.cost import run_costs
from hpcddp.slurm import accounting, report

# A run preempted once, then a rank died (the helper recorded it: no times of its own, its
# start in starts.jsonl), then it finished. 2 nodes of 2 GPUs; the failed job held a spare.
ATTEMPTS = [
    {"job": "41", "restart": 0, "nodes": ["n1", "n2"], "cause": "preempted", "from_step": 0,
     "step": 40, "started": 1000.0, "loaded": 1010.0, "first_step": 1012.0, "gpus": 4,
     "allocated_nodes": 2, "time": 1100.0},
    {"job": "41", "restart": 1, "nodes": ["n1", "n2"], "cause": "failed: task 3 on n2: Killed",
     "from_step": 40, "step": 60, "then": "requeue", "allocated_nodes": 3, "detected": 1290.0,
     "time": 1300.0},
    {"job": "41", "restart": 2, "nodes": ["n1", "n3"], "cause": "finished", "from_step": 60,
     "step": 100, "started": 1500.0, "loaded": 1505.0, "first_step": 1507.0, "gpus": 4,
     "allocated_nodes": 2, "time": 1600.0},
]  # fmt: skip
STARTS = [
    {"job": "41", "restart": 0, "started": 1000.0, "loaded": 1010.0, "first_step": 1012.0,
     "gpus": 4, "time": 1012.0},
    {"job": "41", "restart": 1, "started": 1200.0, "loaded": 1208.0, "first_step": 1210.0,
     "gpus": 4, "time": 1210.0},
]  # fmt: skip


def stand_in_run(folder, records=ATTEMPTS, starts=STARTS):
    folder.mkdir(parents=True)
    (folder / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "starts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in starts))
    return folder


def test_each_attempt_is_costed_from_what_the_run_recorded(tmp_path):
    first, failed, last = run_costs(stand_in_run(tmp_path / "run"))
    assert [(c.nodes, c.gpus, c.wall_s, c.steps_gained) for c in (first, failed, last)] == [
        (2, 4, 100.0, 40),
        (3, 4, 100.0, 20),  # its start from starts.jsonl; the spare node paid for too
        (2, 4, 100.0, 40),
    ]
    assert (first.lost_s, first.startup_s) == (0.0, 12.0)  # nothing was lost before it
    assert (failed.waited_s, failed.startup_s, failed.lost_s) == (100.0, 10.0, 110.0)
    # the failure seen at 1290, ranks gone at 1300, the job back at 1500, first step at 1507
    assert (last.detect_s, last.waited_s, last.startup_s, last.lost_s) == (10.0, 200.0, 7.0, 217.0)
    pace = (90 + 95) / 80  # seconds per step on the attempts whose every step was kept
    assert (first.training_s, last.training_s) == (90.0, 95.0)
    assert failed.training_s == pytest.approx(20 * pace)  # its steps after step 60 are lost


def test_node_hours_are_the_sum_of_nodes_times_wall_over_attempts(tmp_path):
    costs = run_costs(stand_in_run(tmp_path / "run"))
    made = report.RunReport(tmp_path / "run", costs, [None] * len(costs))
    totals = made.totals
    assert totals.node_hours == pytest.approx(sum(c.nodes * c.wall_s for c in costs) / 3600, 0.01)
    assert totals.node_hours == pytest.approx((200 + 300 + 200) / 3600)
    assert totals.gpu_hours == pytest.approx(3 * 4 * 100 / 3600)
    assert totals.useful_share == pytest.approx((90 + 20 * 185 / 80 + 95) / 300)
    assert (totals.attempts, totals.steps_gained, totals.lost_s) == (3, 100, 327.0)


def test_report_prints_a_table_and_json_and_says_when_slurm_has_no_accounting(
    tmp_path, capsys, monkeypatch
):
    run_dir = stand_in_run(tmp_path / "run")
    monkeypatch.setattr(accounting, "job_runs", lambda jobs, run=None: ([], "sacct: disabled"))
    assert main(["report", str(run_dir)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == str(run_dir) and table[1].split()[:3] == ["attempt", "job", "ended"]
    assert table[2].split()[:3] == ["1", "41", "preempted"]
    assert table[-2].split()[:3] == ["total", "3", "attempt(s)"]
    assert table[-1] == "Slurm accounting: sacct: disabled; the figures are what the runs recorded."
    assert main(["report", str(run_dir), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["accounting"] == "sacct: disabled"
    assert got["totals"]["node_hours"] == pytest.approx(700 / 3600)
    assert [a["steps_gained"] for a in got["runs"][0]["attempts"]] == [40, 20, 40]


def _iso(epoch: float) -> str:
    """As sacct prints times with SLURM_TIME_FORMAT=standard: local time, ISO."""
    return datetime.datetime.fromtimestamp(epoch).isoformat()


SACCT = f"41|41|PREEMPTED|101|2|cpu=4,gres/gpu=4,node=2|{_iso(999)}|{_iso(1100)}\n"


def test_slurm_s_own_figures_stand_beside_each_attempt_where_sacct_answers(tmp_path):
    calls = []

    def sacct(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, SACCT, "")

    made, why_not = report.reports(stand_in_run(tmp_path / "run"), run=sacct)
    assert why_not == "" and calls[0][:2] == ["sacct", "-X"] and "--duplicates" in calls[0]
    found = made[0].slurm
    assert found[0] == accounting.JobRun("41", "41", "PREEMPTED", 101.0, 2, 4, 999.0, 1100.0)
    assert found[1:] == [None, None]  # sacct listed only the first run of job 41
    text = report.as_text(made, why_not)
    assert "slurm: state, elapsed, nodes" in text and "PREEMPTED, 0:01:41, 2" in text


def test_sacct_that_refuses_or_hangs_is_one_line(tmp_path):
    def disabled(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "Slurm accounting storage is disabled\n")

    waited = []

    def hangs(command, **kwargs):
        waited.append(kwargs["timeout"])
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    def missing(command, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "sacct")

    assert accounting.job_runs(["41"], disabled) == (
        [], "sacct: Slurm accounting storage is disabled"
    )  # fmt: skip
    runs, why = accounting.job_runs(["41"], hangs)
    assert runs == [] and why.startswith("sacct did not answer")
    assert 0 < waited[0] <= 10  # the docs: a hanging sacct costs the report 10 s at most
    runs, why = accounting.job_runs(["41"], missing)
    assert runs == [] and why.startswith("sacct did not answer") and "\n" not in why
    assert accounting.job_runs(["", "local"]) == ([], "no Slurm job (a local run)")


def test_a_sweep_reports_each_point_and_the_totals(tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    for point in ("10", "2"):
        stand_in_run(sweep / point, ATTEMPTS[:1], STARTS[:1])
    (sweep / "sweep.json").write_text("{}")
    monkeypatch.setattr(accounting, "job_runs", lambda jobs, run=None: ([], "sacct: disabled"))
    made, why_not = report.reports(sweep)
    assert [r.run_dir.name for r in made] == ["2", "10"]  # natural order
    lines = report.as_text(made, why_not).splitlines()
    assert lines[1].endswith("  2") and lines[2].endswith("  10")
    assert lines[3].split()[:3] == ["all", "2", "attempt(s)"]
    got = json.loads(report.as_json(made, why_not))
    assert got["totals"]["node_hours"] == pytest.approx(2 * 200 / 3600)


def test_a_folder_without_a_run_is_refused_in_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} holds no run" in err and "HINT" in err and err.count("\n") == 1
