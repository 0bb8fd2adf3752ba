"""hpcddp.submit / sweep / status / logs without Slurm: parameter mapping, sweep points,
scheduler-output parsing (Slurm faked only at the subprocess edge), and a real local job."""

import argparse
import json
import os
import pathlib
import pickle
import shutil
import subprocess
import time

import pytest

from hpcddp.cli import jobs
from hpcddp.config import Config, SlurmConfig, load_config
from hpcddp.errors import ConfigError, LaunchError
from hpcddp.slurm import grid, submission, sweep_submit
from hpcddp.slurm import index as job_index
from hpcddp.slurm import queue as slurm_queue
from hpcddp.slurm import status as job_status
from tests.fixtures.helpers import QUICK, REPO, run_cli


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """Every test gets its own job index and runs from the repository root."""
    monkeypatch.setenv("HPCDDP_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.chdir(REPO)


def fake_run(replies: dict):
    """A subprocess.run stand-in: the first word(s) of the command pick (rc, stdout, stderr)."""
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        for prefix, reply in replies.items():
            if " ".join(command).startswith(prefix):
                if isinstance(reply, Exception):
                    raise reply
                rc, out, err = reply
                return subprocess.CompletedProcess(command, rc, out, err)
        raise AssertionError(f"unexpected command {command}")

    run.calls = calls
    return run


# -- parameters -------------------------------------------------------------------------------


def test_default_slurm_section_maps_onto_submitit_parameters():
    params = submission.executor_parameters(SlurmConfig())
    assert params == {
        "name": "hpcddp",
        "nodes": 1,
        "tasks_per_node": 1,
        "cpus_per_task": 1,
        "timeout_min": 60,
        "slurm_signal_delay_s": 120,
        "slurm_srun_args": ["--kill-on-bad-exit=1"],
        "slurm_setup": ["export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}"],
        "slurm_additional_parameters": {"requeue": True},
    }  # no partition/account/qos/mem/gpus: empty and zero mean "the cluster's default"


def test_every_field_maps_and_extra_options_pass_through():
    slurm = SlurmConfig(
        nodes=4,
        tasks_per_node=8,
        gpus_per_node=8,
        cpus_per_task=6,
        mem_gb=480,
        time_min=720,
        partition="gpu",
        account="proj1",
        qos="high",
        job_name="big",
        signal_delay_s=90,
        extra={"gres": "gpu:1", "overcommit": True, "hold": False},
    )
    params = submission.executor_parameters(slurm)
    assert {
        k: params[k]
        for k in (
            "nodes",
            "tasks_per_node",
            "gpus_per_node",
            "cpus_per_task",
            "mem_gb",
            "timeout_min",
            "name",
        )
    } == {
        "nodes": 4,
        "tasks_per_node": 8,
        "gpus_per_node": 8,
        "cpus_per_task": 6,
        "mem_gb": 480,
        "timeout_min": 720,
        "name": "big",
    }
    assert (params["slurm_partition"], params["slurm_account"], params["slurm_qos"]) == (
        "gpu",
        "proj1",
        "high",
    )
    assert params["slurm_signal_delay_s"] == 90
    assert params["slurm_additional_parameters"] == {
        "requeue": True,
        "gres": "gpu:1",
        "overcommit": True,
    }  # false leaves an extra option out, as in the job script


def test_submitit_renders_the_mapping_into_the_sbatch_script(monkeypatch, tmp_path):
    """Through submitit's own checks and renderer: what sbatch will actually read."""
    import submitit

    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")  # "srun exists"
    config = load_config("examples/quickstart.yaml", [f"run.dir={tmp_path}/run"])
    config = submission.resolve_config(
        config, (), {"nodes": 2, "tasks_per_node": 4, "partition": "debug", "mem_gb": 1.5}
    )
    executor = submission.executor_for(config, "slurm")
    assert isinstance(executor, submitit.AutoExecutor)
    assert executor.folder == tmp_path / "run" / "submitit"
    text = executor._executor._make_submission_file_text("CMD", "uid")
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --requeue",
        "#SBATCH --signal=USR2@120",
        "#SBATCH --time=10",
        "#SBATCH --partition=debug",
        "#SBATCH --mem=1536MB",
        "#SBATCH --job-name=quickstart",
        "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}",
    ):
        assert line in text.splitlines(), line
    assert "--kill-on-bad-exit=1 CMD" in text


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        submission.submit("examples/quickstart.yaml", cluster="local", node=2)
    assert "unknown submission option(s) ['node']" in str(err.value)
    assert "nodes, tasks_per_node, gpus_per_node" in str(err.value)
    assert not (pathlib.Path(os.environ["HPCDDP_JOBS_DIR"])).exists()  # nothing submitted


def test_option_values_are_type_checked_through_the_config():
    with pytest.raises(ConfigError, match="slurm.nodes must be int"):
        submission.resolve_config("examples/quickstart.yaml", (), {"nodes": "two"})
    with pytest.raises(ConfigError, match="slurm.time_min must be > 0"):
        submission.resolve_config(Config(), (), {"time_min": 0})


def test_config_may_be_a_config_object_with_overrides():
    config = submission.resolve_config(Config(), ["optim.lr=0.5"], {"tasks_per_node": 3})
    assert config.optim.lr == 0.5 and config.slurm.tasks_per_node == 3
    with pytest.raises(ConfigError, match="must be a hpcddp.Config or a YAML path"):
        submission.resolve_config({"optim": {}})


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"nodes": 3}, "set slurm.nodes instead"),
        ({"ntasks_per_node": 3}, "set slurm.tasks_per_node instead"),
        ({"output": "x.out"}, "hpcddp sets it"),
        ({"gres": ["a", "b"]}, "must be a string, number or true"),
    ],
)
def test_extra_options_cannot_contradict_named_ones(extra, message):
    with pytest.raises(ConfigError, match=message):
        submission.executor_parameters(SlurmConfig(extra=extra))


def test_local_executor_refuses_many_nodes():
    config = submission.resolve_config(Config(), (), {"nodes": 2})
    with pytest.raises(ConfigError, match="runs on this one machine"):
        submission.executor_for(config, "local")


# -- where the job runs -----------------------------------------------------------------------


def test_cluster_choice():
    no_sbatch = lambda name: None  # noqa: E731
    has_sbatch = lambda name: f"/usr/bin/{name}"  # noqa: E731
    up = fake_run({"scontrol ping": (0, "Slurmctld(primary) at ctl is UP\n", "")})
    down = fake_run({"scontrol ping": (1, "Slurmctld(primary) at ctl is DOWN\n", "")})
    hung = fake_run({"scontrol ping": subprocess.TimeoutExpired("scontrol", 15)})
    assert submission.choose_cluster(None, no_sbatch, up) == "local"
    assert up.calls == []  # no Slurm client is run when sbatch is absent
    assert submission.choose_cluster(None, has_sbatch, up) == "slurm"
    for unanswered in (down, hung):  # never train on a login node by accident
        with pytest.raises(LaunchError, match="no Slurm controller answered.*cluster='local'"):
            submission.choose_cluster(None, has_sbatch, unanswered)
    assert submission.choose_cluster("local", has_sbatch, up) == "local"
    with pytest.raises(ConfigError, match="not one of"):
        submission.choose_cluster("kubernetes")
    with pytest.raises(LaunchError, match="sbatch is not on PATH"):
        submission.choose_cluster("slurm", no_sbatch, up)


# -- sweeps -----------------------------------------------------------------------------------


def test_sweep_points_are_the_cartesian_product_first_key_slowest():
    points = grid.sweep_points({"optim.lr": [0.1, 0.01], "train.epochs": [1, 2, 3]})
    assert points == [
        (("optim.lr", 0.1), ("train.epochs", 1)),
        (("optim.lr", 0.1), ("train.epochs", 2)),
        (("optim.lr", 0.1), ("train.epochs", 3)),
        (("optim.lr", 0.01), ("train.epochs", 1)),
        (("optim.lr", 0.01), ("train.epochs", 2)),
        (("optim.lr", 0.01), ("train.epochs", 3)),
    ]


def test_each_point_gets_its_own_checked_config_and_safe_run_dir():
    base = load_config("examples/quickstart.yaml", ["run.dir=runs/sw"])
    point = (("optim.lr", 1), ("optim.name", "sgd"), ("data.kwargs.train_size", 64))
    config = grid.point_config(base, 7, point)
    assert config.optim.lr == 1.0 and isinstance(config.optim.lr, float)  # coerced by the config
    assert config.optim.name == "sgd" and config.data.kwargs["train_size"] == 64
    assert config.data.kwargs["in_features"] == 16  # the rest of kwargs is kept
    assert config.run.dir == "runs/sw/7-optim.lr=1,optim.name=sgd,data.kwargs.train_size=64"
    assert base.optim.lr == 0.003  # the base is not modified


def test_run_dir_names_keep_only_safe_characters():
    name = grid.run_dir_name(3, (("model.kwargs", {"a": "x y/z"}), ("run.name", "é!")))
    assert name == "3-model.kwargs=_a_x_y_z_,run.name=_"
    assert grid.run_dir_name(0, (("data.shuffle", False),)) == "0-data.shuffle=false"
    assert len(grid.run_dir_name(12, (("optim.lr", "9" * 500),))) == 120


@pytest.mark.parametrize(
    "bad, message",
    [
        ({}, "non-empty mapping"),
        ({"lr": [1]}, "not of the form section.key"),
        ({"optim.lr": []}, "must be a non-empty list"),
        ({"optim.lr": "0.1"}, "must be a non-empty list"),
        ({"slurm.nodes": [1, 2]}, "cannot vary within one job array"),
        ({"run.dir": ["a", "b"]}, "cannot vary within one job array"),
        ({"optim.lr": [object()]}, "must be plain numbers"),
        ({"optim.lr": [float("nan")]}, "must be plain numbers"),
    ],
)
def test_bad_grids_are_refused(bad, message):
    with pytest.raises(ConfigError, match=message):
        grid.sweep_points(bad)


def test_bad_sweep_values_fail_at_submission_not_in_the_job():
    with pytest.raises(
        ConfigError,
        match=r"sweep point 1 \(optim.lr=fast\): optim.lr must be "
        r"float, got str 'fast'",
    ):
        sweep_submit.sweep("examples/quickstart.yaml", {"optim.lr": [0.1, "fast"]}, cluster="local")
    with pytest.raises(ConfigError, match="unknown key optim.rate; valid keys: optim.name"):
        sweep_submit.sweep("examples/quickstart.yaml", {"optim.rate": [0.1]}, cluster="local")
    with pytest.raises(ConfigError, match="unknown key nope; valid keys: run, model"):
        sweep_submit.sweep("examples/quickstart.yaml", {"nope.x": [1]}, cluster="local")
    with pytest.raises(ConfigError, match="max_parallel must be a positive integer"):
        sweep_submit.sweep(
            "examples/quickstart.yaml", {"optim.lr": [0.1]}, max_parallel=0, cluster="local"
        )
    assert not pathlib.Path(os.environ["HPCDDP_JOBS_DIR"]).exists()  # nothing was submitted


# -- what the scheduler says ------------------------------------------------------------------

# Captured from Slurm 22.05 on the local cluster (trimmed), array 56 with %1 parallelism.
SCONTROL_ARRAY = (
    "JobId=56 ArrayJobId=56 ArrayTaskId=1 ArrayTaskThrottle=1 JobName=quickstart "
    "JobState=PENDING Reason=JobArrayTaskLimit Dependency=(null) Requeue=1 Restarts=0 "
    "NodeList= NumNodes=1-1 TRES=cpu=2,mem=24105M,node=1,billing=2 Socks/Node=* "
    "Command=/tmp/s/submitit/.submission_file_02.sh run.dir=/tmp/x WorkDir=/work/main "
    "StdErr=/tmp/s/submitit/56_1_0_log.err StdIn=/dev/null StdOut=/tmp/s/submitit/56_1_0_log.out "
    "Power= \n"
    "JobId=57 ArrayJobId=56 ArrayTaskId=0 ArrayTaskThrottle=1 JobName=quickstart "
    "JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 NodeList=n1 "
    "NumNodes=1 StdOut=/tmp/s/submitit/56_0_0_log.out Power= \n"
)


def test_scontrol_records_are_parsed_field_by_field():
    first, second = slurm_queue.parse_scontrol(SCONTROL_ARRAY)
    assert first["JobState"] == "PENDING" and first["Reason"] == "JobArrayTaskLimit"
    assert first["NodeList"] == "" and first["TRES"] == "cpu=2,mem=24105M,node=1,billing=2"
    assert first["Command"] == "/tmp/s/submitit/.submission_file_02.sh run.dir=/tmp/x"
    assert first["StdOut"] == "/tmp/s/submitit/56_1_0_log.out" and first["Power"] == ""
    assert (second["JobId"], second["ArrayTaskId"], second["NodeList"]) == ("57", "0", "n1")


def test_scontrol_record_picks_the_array_task():
    run = fake_run({"scontrol show job -o 56_0": (0, SCONTROL_ARRAY, "")})
    assert slurm_queue.scontrol_record("56_0", run)["JobId"] == "57"
    gone = fake_run({"scontrol": (1, "", "slurm_load_jobs error: Invalid job id specified\n")})
    assert slurm_queue.scontrol_record("56_0", gone) is None
    covers = slurm_queue._covers
    assert covers("0-7%2", 5) and covers("1,4-5", 4) and not covers("1,4-5", 2)


def test_squeue_states_expand_pending_arrays_and_mark_forgotten_jobs():
    run = fake_run(
        {
            "squeue": (
                0,
                "61_[2-3%1]|PENDING||JobArrayTaskLimit\n"
                "61_1|RUNNING|n1|None\n61_0|COMPLETED|n2|None\n",
                "",
            )
        }
    )
    states = slurm_queue.query_states(["61_0", "61_1", "61_2", "61_3", "61_4"], run)
    assert run.calls == [["squeue", "-h", "-t", "all", "-j", "61", "-o", "%i|%T|%N|%r"]]
    assert {k: v["State"] for k, v in states.items()} == {
        "61_0": "COMPLETED",
        "61_1": "RUNNING",
        "61_2": "PENDING",
        "61_3": "PENDING",
        "61_4": slurm_queue.LEFT_QUEUE,
    }
    assert states["61_2"]["Reason"] == "JobArrayTaskLimit"


def test_squeue_that_cannot_answer_changes_nothing():
    forgotten = fake_run({"squeue": (1, "", "slurm_load_jobs error: Invalid job id specified\n")})
    assert slurm_queue.query_states(["9"], forgotten) == {
        "9": {"State": slurm_queue.LEFT_QUEUE, "NodeList": "", "Reason": ""}
    }
    down = fake_run(
        {
            "squeue": (
                1,
                "",
                "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n",
            )
        }
    )
    assert slurm_queue.query_states(["9"], down) == {}
    assert slurm_queue.query_states(["9"], fake_run({"squeue": FileNotFoundError("squeue")})) == {}


@pytest.mark.parametrize(
    "slurm, files, expected",
    [
        ("RUNNING", None, "RUNNING"),
        ("PENDING", "COMPLETED", "PENDING"),  # a previous run's summary does not end this job
        ("COMPLETED", "COMPLETED", "COMPLETED"),
        ("COMPLETED", "FAILED", "FAILED"),  # exit 0 but the task raised: FAILED (hydra#1928)
        ("FAILED", None, "FAILED"),
        ("CANCELLED", "COMPLETED", "CANCELLED"),
        ("TIMEOUT", "STOPPED", "TIMEOUT"),  # Slurm's own end states stand
        ("COMPLETED", "STOPPED", "STOPPED"),
        (slurm_queue.LEFT_QUEUE, "COMPLETED", "COMPLETED"),
        (slurm_queue.LEFT_QUEUE, "FAILED", "FAILED"),
        (None, "COMPLETED", "COMPLETED"),
    ],
)
def test_final_state(slurm, files, expected):
    assert job_status.final_state(slurm, files) == expected


@pytest.mark.parametrize("slurm", [slurm_queue.LEFT_QUEUE, None, "COMPLETED"])
def test_without_a_summary_from_this_job_it_is_never_completed(slurm):
    assert job_status.final_state(slurm, None).startswith("UNKNOWN")


def make_record(tmp_path, job_id="77", submitted_at=None, cluster="slurm") -> job_index.JobRecord:
    folder = tmp_path / "run" / "submitit"
    folder.mkdir(parents=True, exist_ok=True)
    record = job_index.JobRecord(
        job_id=job_id,
        cluster=cluster,
        run_dir=str(tmp_path / "run"),
        submitit_folder=str(folder),
        stdout=str(folder / f"{job_id}_0_log.out"),
        stderr=str(folder / f"{job_id}_0_log.err"),
        num_tasks=2,
        submitted_at=time.time() if submitted_at is None else submitted_at,
    )
    job_index.write_record(record)
    return record


def test_status_after_the_job_left_slurm_comes_from_the_index_and_files(tmp_path):
    record = make_record(tmp_path)
    forgotten = fake_run({"scontrol": (1, "", "slurm_load_jobs error: Invalid job id specified")})
    (status,) = job_status.job_status("77", forgotten)
    assert status.state.startswith("UNKNOWN") and not status.summary

    (tmp_path / "run" / "summary.json").write_text("{}")
    (status,) = job_status.job_status("77", forgotten)
    assert (status.state, status.summary, status.run_dir) == ("COMPLETED", True, record.run_dir)

    with record.result_pickle().open("wb") as handle:
        pickle.dump(("error", "Traceback ...\nValueError: boom"), handle)
    assert job_status.job_status("77", forgotten)[0].state == "FAILED"


def test_a_stopped_outcome_in_the_result_pickle_is_stopped(tmp_path):
    """The task's typed outcome, as submitit pickled it, says STOPPED; a finished one does not."""
    from hpcddp.outcome import RunOutcome, StopReason

    record = make_record(tmp_path)
    forgotten = fake_run({"scontrol": (1, "", "Invalid job id specified")})
    with record.result_pickle().open("wb") as handle:
        pickle.dump(("success", RunOutcome(step=3, stop=StopReason.TERMINATED)), handle)
    assert job_status.job_status("77", forgotten)[0].state == "STOPPED"
    with record.result_pickle().open("wb") as handle:
        pickle.dump(("success", RunOutcome(step=9, summary={"steps": 9})), handle)
    (tmp_path / "run" / "summary.json").write_text("{}")
    assert job_status.job_status("77", forgotten)[0].state == "COMPLETED"


def test_a_summary_older_than_the_submission_is_a_previous_runs(tmp_path):
    make_record(tmp_path, submitted_at=time.time() + 3600)
    (tmp_path / "run" / "summary.json").write_text("{}")
    forgotten = fake_run({"scontrol": (1, "", "Invalid job id specified")})
    assert job_status.job_status("77", forgotten)[0].state.startswith("UNKNOWN")


def test_status_of_a_pending_job_shows_the_reason(tmp_path):
    make_record(tmp_path, job_id="56_1")
    run = fake_run({"scontrol show job -o 56_1": (0, SCONTROL_ARRAY, "")})
    (status,) = job_status.job_status("56_1", run)
    assert status.state == "PENDING"
    assert "reason:       JobArrayTaskLimit" in status.lines()
    assert "nodes:        -" in status.lines()


def test_status_of_an_array_lists_every_task(tmp_path):
    for index in (1, 0, 10):
        make_record(tmp_path, job_id=f"56_{index}")
    run = fake_run({"scontrol show job -o 56_": (0, SCONTROL_ARRAY, "")})
    assert [s.job_id for s in job_status.job_status("56", run)] == ["56_0", "56_1", "56_10"]
    with pytest.raises(ConfigError, match="is an array of 3 tasks"):
        job_status.log_paths("56", None, run)


def test_status_of_a_job_hpcddp_did_not_submit(tmp_path):
    run = fake_run({"scontrol show job -o 57": (0, SCONTROL_ARRAY.splitlines()[1], "")})
    (status,) = job_status.job_status("57", run)
    assert (status.state, status.nodes, status.run_dir) == ("RUNNING", "n1", "")
    assert "run dir:      unknown (not submitted with hpcddp submit)" in status.lines()
    assert job_status.log_paths("57", None, run) == [pathlib.Path("/tmp/s/submitit/56_0_0_log.out")]
    with pytest.raises(ConfigError, match="run directory is unknown"):
        job_status.log_paths("57", 3, run)
    gone = fake_run({"scontrol": (1, "", "Invalid job id specified")})
    with pytest.raises(ConfigError, match="no job 58"):
        job_status.job_status("58", gone)


def test_status_of_a_missing_directory_is_one_line_not_a_traceback(tmp_path):
    missing = tmp_path / "no-such-run"
    done = run_cli("status", str(missing), env={"HPCDDP_JOBS_DIR": str(tmp_path / "jobs")})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"hpcddp: error: {missing}: no such directory. "
        "HINT: pass a run directory, a sweep directory or a job id."
    ]
    assert job_index.find_records(str(missing), tmp_path) == []  # a path is never a job id
    assert job_index.find_records("*", tmp_path) == []


def test_log_paths_of_a_submitted_job(tmp_path):
    record = make_record(tmp_path)
    assert job_status.log_paths("77", None) == [
        pathlib.Path(record.stdout),
        pathlib.Path(record.stderr),
    ]
    assert job_status.log_paths("77", 3) == [tmp_path / "run" / "logs" / "rank-3.log"]


def test_the_job_index_is_plain_json(tmp_path):
    record = make_record(tmp_path, job_id="4242", cluster="local")
    path = pathlib.Path(os.environ["HPCDDP_JOBS_DIR"]) / "local-4242.json"
    assert json.loads(path.read_text())["run_dir"] == record.run_dir
    assert job_index.find_records("4242") == job_index.find_records("local-4242") == [record]
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        job_index.find_records("4242")


def test_the_watcher_reads_squeue_not_sacct(monkeypatch):
    """submitit's job.result() must end on clusters without accounting (submitit#1720)."""
    calls = []

    def run(command, **kwargs):
        calls.append(command[0])
        out = "88|RUNNING|n1|None\n" if len(calls) == 1 else ""
        rc, err = (0, "") if out else (1, "slurm_load_jobs error: Invalid job id specified")
        return subprocess.CompletedProcess(command, rc, out, err)

    monkeypatch.setattr(subprocess, "run", run)
    watcher = submission._SqueueWatcher(delay_s=1)
    watcher.register_job("88")
    assert not watcher.is_done("88", mode="force")
    time.sleep(0.01)  # submitit ignores forced updates less than 1 ms apart
    assert watcher.is_done("88", mode="force")  # no longer listed: it ended
    assert calls == ["squeue", "squeue"]


# -- the command line -------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hpcddp")
    jobs.add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_submit_options_become_slurm_options(monkeypatch):
    seen = {}
    monkeypatch.setattr(
        submission,
        "submit",
        lambda config, overrides, **kw: (
            seen.update(config=config, overrides=overrides, **kw)
            or type("J", (), {"job_id": "123"})()
        ),
    )
    args = parse(
        "submit",
        "examples/quickstart.yaml",
        "--nodes",
        "2",
        "--tasks-per-node",
        "4",
        "--time",
        "30",
        "--partition",
        "gpu",
        "optim.lr=0.1",
    )
    assert args.func(args) == 0
    assert seen == {
        "config": "examples/quickstart.yaml",
        "overrides": ["optim.lr=0.1"],
        "cluster": None,
        "check": False,
        "nodes": 2,
        "tasks_per_node": 4,
        "time_min": 30,
        "partition": "gpu",
    }
    args = parse("submit", "optim.lr=0.1")
    with pytest.raises(ConfigError, match="no config given"):
        args.func(args)
    args = parse("submit", "x.yaml", "--nodes", "two")
    with pytest.raises(SystemExit):  # argparse's usage error, exit status 2
        args.func(args)
    args = parse("submit", "--nodes", "3", "x.yaml", "--cluster", "local", "k.v=1")
    assert args.func(args) == 0
    assert (seen["nodes"], seen["cluster"], seen["overrides"]) == (3, "local", ["k.v=1"])
    args = parse("submit", "x.yaml", "--check", "--nodes", "2")  # the pre-flight, same resources
    assert args.func(args) == 0
    assert (seen["check"], seen["nodes"]) == (True, 2)


def test_logs_rank_must_not_be_negative():
    args = parse("logs", "77", "--rank", "-1")
    with pytest.raises(ConfigError, match="--rank must be >= 0"):
        args.func(args)


# -- a real job on this machine ---------------------------------------------------------------


@pytest.mark.slow
def test_local_submission_runs_two_ranks_and_returns_the_summary(tmp_path, capsys):
    run_dir = tmp_path / "run"
    job = submission.submit(
        "examples/quickstart.yaml",
        [f"run.dir={run_dir}", *QUICK],
        cluster="local",
        tasks_per_node=2,
    )
    assert isinstance(job, submission.LocalRun) and job.num_tasks == 2
    summary = job.result().summary
    assert summary.world_size == 2 and summary.launcher == "local"
    assert summary.job_id == job.job_id  # the local controller's pid
    assert (run_dir / "summary.json").read_text() == summary.to_json()  # the file, as returned
    assert sorted(p.name for p in (run_dir / "submitit").glob("*_result.pkl")) == [
        f"{job.job_id}_0_result.pkl",
        f"{job.job_id}_1_result.pkl",
    ]

    status = parse("status", job.job_id)
    assert status.func(status) == 0
    out = capsys.readouterr().out
    assert f"job:          local-{job.job_id}" in out and "state:        COMPLETED" in out
    assert "summary.json: yes" in out and str(run_dir) in out
    logs = parse("logs", f"local-{job.job_id}", "--rank", "0")
    assert logs.func(logs) == 0
    assert "[rank 0/2" in capsys.readouterr().out


@pytest.mark.slow
def test_a_failing_local_job_raises_and_is_reported_failed(tmp_path, capsys):
    job = submission.submit(
        "examples/quickstart.yaml",
        [f"run.dir={tmp_path}/run", *QUICK, "model.factory=examples.quickstart:nope"],
        cluster="local",
        tasks_per_node=2,
    )
    with pytest.raises(Exception, match="nope"):
        job.result()
    status = parse("status", job.job_id)
    status.func(status)
    assert "state:        FAILED" in capsys.readouterr().out


@pytest.mark.slow
def test_without_sbatch_on_path_submit_runs_locally(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    job = submission.submit(
        load_config("examples/quickstart.yaml", QUICK),
        [f"run.dir={tmp_path}/run", "train.max_steps=2"],
    )
    assert isinstance(job, submission.LocalRun)
    assert job.result().summary.steps == 2


def test_job_records_are_written_durably(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    record = make_record(tmp_path, job_id="91")
    assert synced  # the data (and the directory) reach the disk before anyone reads the record
    assert job_index.find_records("91") == [record]
    assert [p.name for p in (tmp_path / "jobs").iterdir()] == ["91.json"]  # no temp left behind


SILENT_SCONTROL = "#!/bin/sh\nsleep 600\n"  # a controller that never answers


def test_status_with_an_unreachable_controller_answers_after_the_ask_timeout(tmp_path):
    """`hpcddp status` gives up on a silent controller after ASK_TIMEOUT_S, not its sleep.

    The bound is the ask timeout plus what starting `hpcddp status` costs right now (measured
    here with `--help`, which asks Slurm nothing), so a loaded machine cannot fail it.
    """
    make_record(tmp_path)
    (tmp_path / "run" / "summary.json").write_text("{}")
    make_record(tmp_path / "other", job_id="78")  # no summary: only Slurm could tell
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SILENT_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HPCDDP_JOBS_DIR": str(job_index.jobs_dir())}
    started = time.monotonic()
    assert run_cli("status", "--help", env=env, timeout=120).returncode == 0
    bound = time.monotonic() - started + slurm_queue.ASK_TIMEOUT_S + 5
    for job_id, expected in (("77", "COMPLETED"), ("78", "UNKNOWN (`scontrol show job -o 78`")):
        started = time.monotonic()
        done = run_cli("status", job_id, env=env, timeout=120)
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        state = next(line for line in done.stdout.splitlines() if line.startswith("state:"))
        assert state.split(None, 1)[1].startswith(expected), state
        assert took < bound, f"hpcddp status took {took:.1f} s (bound {bound:.1f} s)"
    started = time.monotonic()
    unknown = run_cli("status", "99", env=env, timeout=120)
    assert unknown.returncode == 1 and time.monotonic() - started < bound
    assert unknown.stderr.startswith("hpcddp: error: `scontrol show job -o 99` did not answer")


def test_a_controller_that_refuses_is_not_a_forgotten_job(tmp_path):
    make_record(tmp_path)
    down = fake_run(
        {"scontrol": (1, "", "slurm_load_jobs error: Unable to contact slurm controller")}
    )
    (status,) = job_status.job_status("77", down)
    assert (
        status.state == "UNKNOWN (Slurm could not say anything about job 77: slurm_load_jobs "
        "error: Unable to contact slurm controller.)"
    )
    with pytest.raises(slurm_queue.SlurmUnreachable, match="Unable to contact slurm controller"):
        job_status.job_status("99", down)


def test_a_summary_that_says_failed_is_a_failed_job(tmp_path):
    make_record(tmp_path)
    (tmp_path / "run" / "summary.json").write_text('{"status": "failed", "reason": "nonfinite"}')
    forgotten = fake_run({"scontrol": (1, "", "Invalid job id specified")})
    assert job_status.job_status("77", forgotten)[0].state == "FAILED (nonfinite)"
