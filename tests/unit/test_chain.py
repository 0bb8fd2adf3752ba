"""Job chains (``slurm.chain=N``), the pure parts: the config's checks, the job's options and
script lines, the links' record, the hand-on instead of a requeue, the cancel decision and the
status rows. The chain on the real cluster is tests/slurm/test_chain.py."""

import json
import os
import time

import pytest

from hpcddp import exit_codes
from hpcddp.cli.train import exit_code
from hpcddp.config import Config, SlurmConfig, load_config
from hpcddp.errors import ConfigError
from hpcddp.launch.distenv import DistEnv
from hpcddp.outcome import RunOutcome, StopReason
from hpcddp.records import attempts, chain_record
from hpcddp.records.chain_record import ChainRecord
from hpcddp.records.rundir import Attempt
from hpcddp.resilience import rules
from hpcddp.slurm import chain, policy, submission, sweep_submit
from hpcddp.slurm.chain_status import link_rows
from hpcddp.slurm.jobscript import JobSpec, render
from hpcddp.slurm.options import sbatch_options
from hpcddp.train import preemption
from hpcddp.train.stopping import Stopping

QUICKSTART = "examples/quickstart.yaml"

# -- the config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["slurm.chain=0"], "slurm.chain must be > 0, got 0. HINT"),
        (["slurm.chain=2.5"], "slurm.chain must be int"),
        (["slurm.chain=3", "run.resume=false"], "must resume the run.*HINT: set run.resume=true"),
        (
            ["slurm.chain=3", "slurm.extra={dependency: afterok:7}"],
            "slurm.extra.dependency would replace.*HINT: remove slurm.extra.dependency",
        ),
    ],
)
def test_a_chain_that_cannot_work_is_one_line_with_a_hint(overrides, words):
    with pytest.raises(ConfigError, match=words) as caught:
        load_config(QUICKSTART, overrides)
    assert "\n" not in str(caught.value)


def test_one_job_may_keep_its_own_dependency():
    config = load_config(QUICKSTART, ["slurm.extra={dependency: afterok:7}"])
    assert "--dependency=afterok:7" in sbatch_options(config.slurm)


# -- the job's options and script -------------------------------------------------------------


def test_links_wait_for_each_other_and_get_no_signal():
    linked = sbatch_options(SlurmConfig(chain=4, signal_delay_s=60))
    assert "--dependency=singleton" in linked
    assert not any(option.startswith("--signal") for option in linked)
    alone = sbatch_options(SlurmConfig(signal_delay_s=60))
    assert "--signal=B:USR2@60" in alone and not any("dependency" in o for o in alone)


def test_the_chain_s_name_is_one_per_run_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = chain.chain_name("train", "runs/a")
    assert name == chain.chain_name("train", tmp_path / "runs" / "a")  # spelt either way
    assert name != chain.chain_name("train", "runs/b")
    assert name.startswith("train-") and len(name) == len("train-") + 8


def test_the_script_of_a_chain_carries_the_name_and_the_dependency(tmp_path):
    config = load_config(QUICKSTART, [f"run.dir={tmp_path}", "slurm.chain=3"])
    lines = render(JobSpec(config, QUICKSTART)).splitlines()
    assert f"#SBATCH --job-name={chain.chain_name('quickstart', tmp_path)}" in lines
    assert "#SBATCH --dependency=singleton" in lines
    # the pre-flight is one job: no chain
    checked = render(JobSpec(config, QUICKSTART, check=True)).splitlines()
    assert "#SBATCH --job-name=quickstart" in checked
    assert not any("dependency" in line for line in checked)


def test_submitit_links_ask_for_the_dependency_and_no_signal():
    params = submission.executor_parameters(SlurmConfig(chain=2, signal_delay_s=60))
    assert params["slurm_additional_parameters"]["dependency"] == "singleton"
    assert params["slurm_signal_delay_s"] == 0


def test_submitit_never_requeues_a_link():
    assert submission.TrainTask(Config(slurm=SlurmConfig(chain=2))).checkpoint() is None
    assert submission.TrainTask(Config()).checkpoint() is not None


def test_a_chain_is_refused_where_it_cannot_be(tmp_path):
    config = Config(slurm=SlurmConfig(chain=2))
    with pytest.raises(ConfigError, match="one job array.*HINT: set slurm.chain=1"):
        sweep_submit.sweep(config, {"optim.lr": [0.1, 0.2]}, cluster="local")
    with pytest.raises(ConfigError, match="submitit's local executor. HINT: set slurm.chain=1"):
        submission.submit(config, [f"run.dir={tmp_path}"], cluster="local")


# -- the record of the links ------------------------------------------------------------------


def test_the_record_exists_before_the_first_link_can_start(tmp_path):
    seen = []

    def submit_one(link: int) -> str:
        seen.append(chain_record.load(tmp_path))
        return str(100 + link)

    record = chain.submit_links(submit_one, tmp_path, "train-1234abcd", 3)
    assert seen[0] is not None and seen[0].links == () and seen[0].name == "train-1234abcd"
    assert [r.links for r in seen] == [(), ("101",), ("101", "102")]
    assert chain_record.load(tmp_path) == record and record.links == ("101", "102", "103")
    assert record.after("102") == ("103",) and record.after("999") == ()
    assert chain_record.link_of(tmp_path, "103") == (record, 3)
    assert chain_record.link_of(tmp_path, "7") is None


# -- a link at its time limit hands on instead of requeueing -----------------------------------


def stopping(run_dir, job: str) -> Stopping:
    """Rank 0 of one in Slurm job ``job``, with no scontrol on PATH."""
    environ = {"SLURM_JOB_ID": job, "PATH": str(run_dir)}
    env = DistEnv(0, 0, 1, 1, 0, 1, "n1", 29500, "slurm", job, environ=environ)
    vote = preemption.StopVote("gloo", distributed=False)
    flag = preemption.StopFlag()
    made = Stopping(Config(), env, flag, vote, Attempt(job=job), run_dir)
    made.grace_s = 0.1
    return made


def test_a_link_hands_on_and_a_lone_job_requeues(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: no real job is ever requeued
    chain_record.save(tmp_path, ChainRecord("c", 3, time.time(), ("11", "12", "13")))
    link = stopping(tmp_path, "11").conclude(StopReason.PREEMPTED, step=40)
    assert (link.handed_on, link.requeued) == (True, False)
    assert exit_code(link) == exit_codes.OK
    last = stopping(tmp_path, "13").conclude(StopReason.PREEMPTED, step=40)
    assert last.handed_on  # the chain is spent: no requeue either
    alone = stopping(tmp_path, "99").conclude(StopReason.PREEMPTED, step=40)
    assert not alone.handed_on  # no link: it tries to requeue (no scontrol here)
    assert exit_code(alone) == exit_codes.STOPPED_NOT_REQUEUED
    causes = [r["cause"] for r in attempts.records(tmp_path)]
    assert causes == ["preempted"] * 3


# -- what the rest of the chain does when a link ends -----------------------------------------

OK, USAGE = exit_codes.OK, exit_codes.USAGE


@pytest.mark.parametrize(
    "end, why",
    [
        (rules.LinkEnd(OK, ended="completed", cause="finished"), "the run completed"),
        (rules.LinkEnd(OK, ended="failed (non-finite loss)"), "the run failed (non-finite"),
        (rules.LinkEnd(USAGE), "the run failed with status 2 and is not retried"),
        (rules.LinkEnd(137), "the run failed with status 137"),  # the policy stopped retrying
        (rules.LinkEnd(OK, cause="requested"), "the run stopped (requested)"),
        (rules.LinkEnd(OK, cause="preempted"), ""),  # handed on at its time limit
        (rules.LinkEnd(143, terminated=True, cause="terminated"), ""),  # scancel, hard limit
    ],
)
def test_the_cancel_decision(end, why):
    assert rules.why_cancel(end).startswith(why) if why else rules.why_cancel(end) == ""


def write_summary(run_dir, status: str = "finished", mtime: float | None = None) -> None:
    path = run_dir / "summary.json"
    path.write_text(json.dumps({"status": status, "steps": 64, "reason": "non-finite loss"}))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def test_only_a_summary_written_since_the_chain_was_submitted_ends_it(tmp_path):
    chain_record.save(tmp_path, ChainRecord("c", 3, time.time(), ("11", "12", "13")))
    attempts.record(
        tmp_path, attempts.Ended(job="11", restart=0, nodes=["n1"], cause="preempted", step=40)
    )
    write_summary(tmp_path, mtime=time.time() - 3600)  # an earlier run's, in the same run dir
    assert chain.rest_to_cancel(tmp_path, "11", OK, terminated=False) == ((), "")
    assert chain.ended_before(tmp_path, "12") == ((), "")
    write_summary(tmp_path)
    assert chain.rest_to_cancel(tmp_path, "11", OK, terminated=False) == (
        ("12", "13"),
        "the run completed",
    )
    assert chain.ended_before(tmp_path, "12") == (
        ("13",),
        "the run completed before link 2 started",
    )
    assert chain.rest_to_cancel(tmp_path, "55", OK, terminated=False) == ((), "")  # no link


def test_the_helper_names_the_links_to_cancel_after_the_run_completed(tmp_path, capsys):
    chain_record.save(tmp_path, ChainRecord("c", 3, time.time(), ("11", "12", "13")))
    environ = {"SLURM_JOB_ID": "11", "SLURM_JOB_NODELIST": "n1"}
    common = [f"--config={QUICKSTART}", f"run.dir={tmp_path}", "slurm.chain=3"]
    attempts.record(
        tmp_path, attempts.Ended(job="11", restart=0, nodes=["n1"], cause="preempted", step=40)
    )
    assert policy.main(["after", "--status", "0", *common], environ) == 0
    assert capsys.readouterr().out == "stop 0\n"  # handed on: the next link resumes
    write_summary(tmp_path)
    assert policy.main(["after", "--status", "0", *common], environ) == 0
    out, err = capsys.readouterr()
    assert out == "stop 0 12,13\n"
    assert "the run completed; cancelling the chain's links left: 12,13" in err
    # a link that starts after the run ended runs no step
    assert policy.main(["first", *common], {**environ, "SLURM_JOB_ID": "12"}) == 0
    out, err = capsys.readouterr()
    assert out == "stop 0 13\n"
    assert "the run completed before link 2 started; nothing to do; cancelling the chain's " in err
    # a failure the policy does not retry ends the chain too
    fail = ["after", "--status", "2", "--srun-errors", "", *common]
    assert policy.main(fail, {**environ, "SLURM_JOB_ID": "13"}) == 0
    assert capsys.readouterr().out == "stop 2\n"  # the last link: nothing left


# -- hpcddp status ----------------------------------------------------------------------------


def test_status_shows_each_link_its_state_and_the_steps_it_gained():
    record = ChainRecord("train-1234abcd", 4, 0.0, ("11", "12", "13", "14"))
    history = [
        {"job": "11", "cause": "preempted", "from_step": 0, "step": 46},
        {"job": "12", "cause": "finished", "from_step": 46, "step": 64},
    ]
    states = {
        "11": {"State": "LEFT_QUEUE"},
        "12": {"State": "COMPLETED"},
        "13": {"State": "CANCELLED"},
    }
    lines = [row.line() for row in link_rows(record, history, states)]
    assert lines == [
        "link 1:           job 11       ended       steps 0 -> 46 (+46), handed on at its time "
        "limit",
        "link 2:           job 12       COMPLETED   steps 46 -> 64 (+18), completed the run",
        "link 3:           job 13       CANCELLED",
        "link 4:           job 14       unknown",
    ]


def test_status_says_when_the_chain_is_spent_before_the_run():
    record = ChainRecord("train-1234abcd", 2, 0.0, ("11", "12"))
    history = [
        {"job": "11", "cause": "preempted", "from_step": 0, "step": 40},
        {"job": "12", "cause": "preempted", "from_step": 40, "step": 80},
    ]
    rows = link_rows(record, history, {"11": {"State": "COMPLETED"}, "12": {"State": "COMPLETED"}})
    assert rows[0].ending == "handed on at its time limit"
    assert rows[1].ending.startswith("stopped at its time limit, the chain spent: submit again")


def test_a_handed_on_outcome_is_a_stop_not_a_finish():
    outcome = RunOutcome(step=3, stop=StopReason.PREEMPTED, handed_on=True)
    assert not outcome.finished and exit_code(outcome) == exit_codes.OK


# -- under hpcddp submit: task 0 of a link does what the batch shell does ----------------------


def test_a_submitted_link_after_the_run_ended_leaves_and_cancels_the_rest(tmp_path, monkeypatch):
    bin_dir, cancelled = tmp_path / "bin", tmp_path / "scancelled"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "$@" >> {cancelled}\n')
    (bin_dir / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    task_0 = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "12", "SLURM_PROCID": "0"}
    task_0 |= {"SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    task_0 |= {"SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1"}
    for name, value in task_0.items():
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    chain_record.save(run_dir, ChainRecord("c", 3, time.time(), ("11", "12", "13")))
    write_summary(run_dir)
    config = load_config(QUICKSTART, [f"run.dir={run_dir}", "slurm.chain=3"])
    outcome = submission.TrainTask(config)()  # no torch, no training: the run has ended
    assert outcome.finished and outcome.step == 64
    assert cancelled.read_text() == "13\n"
