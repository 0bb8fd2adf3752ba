"""The job's end time from every source and every SLURM_TIME_FORMAT; the time-limit guard; requeue.

Slurm is faked at its edge: a stand-in ``squeue`` on PATH that prints the end time the way the
real one does for the SLURM_TIME_FORMAT it is given (checked on Slurm 22.05).
"""

import datetime
import stat
import time

import pytest

from hpcddp.errors import ConfigError
from hpcddp.resilience import deadline, requeue

END = datetime.datetime(2026, 11, 21, 9, 30)
SQUEUE = f"""#!/bin/sh
# What squeue -o %e prints for one job, in each SLURM_TIME_FORMAT.
echo "$SLURM_TIME_FORMAT" >> "$(dirname "$0")/formats"
case "$SLURM_TIME_FORMAT" in
    ""|standard) echo "{END.isoformat()}" ;;
    relative) echo "09:30:00" ;;
    %s) echo "{int(END.timestamp())}" ;;
    *) date -d "{END.isoformat()}" +"$SLURM_TIME_FORMAT" ;;
esac
"""


def fake_tool(folder, name, script):
    path = folder / name
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def squeue(tmp_path):
    fake_tool(tmp_path, "squeue", SQUEUE)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ID": "12"}


@pytest.mark.parametrize("fmt", ["", "standard", "relative", "%s", "%d.%m %H:%M", "%b %d %T"])
def test_every_user_time_format_gives_the_same_end(squeue, tmp_path, fmt):
    environ = {**squeue, "SLURM_TIME_FORMAT": fmt}
    assert deadline.job_end_time(environ) == END.timestamp()
    assert (tmp_path / "formats").read_text() == "standard\n"  # asked for, whatever the user set


@pytest.mark.parametrize("text", ["NONE", "N/A", "Unknown", "UNLIMITED", ""])
def test_no_limit_means_no_deadline(tmp_path, text):
    fake_tool(tmp_path, "squeue", f'#!/bin/sh\necho "{text}"\n')
    assert deadline.job_end_time({"PATH": str(tmp_path), "SLURM_JOB_ID": "12"}) is None


def test_squeue_about_this_job_wins_over_a_leaked_end_time(squeue):
    stale = {**squeue, "SLURM_JOB_END_TIME": str(int(time.time()) - 3600)}
    assert deadline.job_end_time(stale) == END.timestamp()
    # and over the job script's, read when the job began: squeue knows a limit changed since
    exported = {**squeue, "HPCDDP_JOB_END_TIME": "12@1900000000"}
    assert deadline.job_end_time(exported) == END.timestamp()


def test_a_stale_end_time_is_never_a_deadline(tmp_path):
    no_squeue = {"PATH": str(tmp_path), "SLURM_JOB_ID": "12"}
    past = {**no_squeue, "SLURM_JOB_END_TIME": str(int(time.time()) - 60)}
    assert deadline.job_end_time(past) is None  # an outer allocation's, long over
    future = int(time.time()) + 600
    assert deadline.job_end_time({**no_squeue, "SLURM_JOB_END_TIME": str(future)}) == future


def test_the_job_scripts_end_time_counts_only_for_its_own_job(tmp_path):
    no_squeue = {"PATH": str(tmp_path), "SLURM_JOB_ID": "12"}
    ours, theirs = (
        {"HPCDDP_JOB_END_TIME": "12@1900000000"},
        {"HPCDDP_JOB_END_TIME": "11@1900000000"},
    )
    assert deadline.job_end_time({**no_squeue, **ours}) == 1900000000.0
    assert deadline.job_end_time({**no_squeue, **theirs}) is None
    iso = {"HPCDDP_JOB_END_TIME": f"12@{END.isoformat()}"}  # as the script writes it
    assert deadline.job_end_time({**no_squeue, **iso}) == END.timestamp()


def test_outside_slurm_only_a_future_end_time_counts():
    assert deadline.job_end_time({}) is None
    assert deadline.job_end_time({"SLURM_JOB_END_TIME": "1700000000"}) is None  # in the past


@pytest.mark.parametrize(
    "left_s, margin_s, refused",
    [(59, 120, True), (120, 120, True), (121, 120, False), (3600, 120, False), (5, 0, False)],
)
def test_a_job_too_short_for_its_stop_margin_is_refused(left_s, margin_s, refused):
    now = 1_000_000.0
    if not refused:
        deadline.check_time_fits(now + left_s, margin_s, now)
        return
    with pytest.raises(ConfigError, match=rf"the job ends in {left_s} s, within .*=120 s.*HINT"):
        deadline.check_time_fits(now + left_s, margin_s, now)


def test_no_limit_passes_the_guard():
    deadline.check_time_fits(None, 120, 0.0)


# -- requeue -------------------------------------------------------------------------------------


def test_requeue_outside_slurm_says_so():
    assert requeue.requeue({}) == (False, "not a Slurm job, nothing to requeue")


def test_requeue_without_scontrol_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    ok, why = requeue.requeue({"SLURM_JOB_ID": "12"})
    assert not ok and "scontrol is not on PATH" in why


def test_requeue_asks_for_the_array_task_not_the_whole_array(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    fake_tool(tmp_path, "scontrol", f'#!/bin/sh\necho "$@" >> {log}\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    ok, why = requeue.requeue(
        {"SLURM_JOB_ID": "107", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "7"}
    )
    assert ok and why == "job 100_7 requeued"
    assert log.read_text() == "requeue 100_7\n"


def test_refused_requeue_is_reported_not_hidden(tmp_path, monkeypatch):
    fake_tool(
        tmp_path,
        "scontrol",
        '#!/bin/sh\necho "Requested operation is presently disabled" >&2\nexit 1\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    ok, why = requeue.requeue({"SLURM_JOB_ID": "12"})
    assert not ok and why == "scontrol requeue 12 failed: Requested operation is presently disabled"
