"""The Slurm option table: every row reaches sbatch, submitit and the command line.

The rows are `SlurmConfig`'s fields declared with `slurm_option`; each test here runs over all of
them, so a new row is tested by being added. A row's example value is what it is tried with.
"""

import argparse
import shutil

import pytest

from hpcddp.cli import jobs as jobs_cli
from hpcddp.cli import sbatch as sbatch_cli
from hpcddp.cli import sweep as sweep_cli
from hpcddp.config import Config, SlurmConfig, from_dict, load_config
from hpcddp.errors import ConfigError
from hpcddp.slurm import jobscript, options, submission
from tests.fixtures.helpers import REPO

ROWS = {option.field: option for option in options.TABLE}
EXAMPLES = {field: option.flag.example for field, option in ROWS.items()}


def sbatch_lines(slurm: SlurmConfig) -> list[str]:
    return options.sbatch_options(slurm)


def parser() -> argparse.ArgumentParser:
    """``hpcddp`` with the three subcommands that take the table's flags."""
    top = argparse.ArgumentParser(prog="hpcddp")
    subparsers = top.add_subparsers(dest="command", required=True)
    sbatch_cli.add_parser(subparsers)
    jobs_cli.add_parsers(subparsers)
    sweep_cli.add_parser(subparsers)
    return top


def cli_args(option: options.Option) -> list[str]:
    """The option's flag as a user types it, with its example value."""
    value = option.flag.example
    return [option.flag.cli] if value is True else [option.flag.cli, str(value)]


def test_the_table_is_the_config_fields_that_are_sbatch_options():
    assert list(ROWS)[:3] == ["job_name", "nodes", "tasks_per_node"]
    assert set(ROWS) <= set(SlurmConfig.__dataclass_fields__)
    assert "signal_delay_s" not in ROWS and "extra" not in ROWS  # hpcddp spells those itself
    flags = [option.flag.sbatch for option in options.TABLE]
    assert len(set(flags)) == len(flags) and not set(flags) & {"signal", "output", "requeue"}


@pytest.mark.parametrize("field", list(ROWS))
def test_every_row_reaches_sbatch(field):
    option, value = ROWS[field], EXAMPLES[field]
    lines = sbatch_lines(SlurmConfig(**EXAMPLES))
    spelt = [line for line in lines if line.split("=")[0] == f"--{option.flag.sbatch}"]
    assert len(spelt) == 1, lines
    if value is True:
        assert spelt == [f"--{option.flag.sbatch}"]
    elif option.kind is str:
        assert spelt == [f"--{option.flag.sbatch}={value}"]
    default = SlurmConfig.__dataclass_fields__[field].default
    if not default:  # empty, zero or false: the cluster's default, so no line at all
        assert not [line for line in sbatch_lines(SlurmConfig()) if line in spelt]


@pytest.mark.parametrize("field", list(ROWS))
def test_every_row_reaches_submitit_and_its_script(field, monkeypatch, tmp_path):
    option, value = ROWS[field], EXAMPLES[field]
    params = submission.executor_parameters(SlurmConfig(**EXAMPLES))
    where = params if option.flag.submitit else params["slurm_additional_parameters"]
    assert where[option.flag.submitit or option.flag.sbatch] == value
    # Through submitit's own checks and renderer: what sbatch will read from its script.
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    config = from_dict({"run": {"dir": str(tmp_path)}, "slurm": EXAMPLES})
    executor = submission.executor_for(config, "slurm")
    text = executor._executor._make_submission_file_text("CMD", "uid")
    assert [
        line for line in text.splitlines() if line.startswith(f"#SBATCH --{option.flag.sbatch}")
    ]


@pytest.mark.parametrize("command", ["sbatch", "submit", "sweep"])
@pytest.mark.parametrize("field", list(ROWS))
def test_every_row_is_a_flag_of_sbatch_submit_and_sweep(field, command):
    option = ROWS[field]
    args = parser().parse_args([command, *cli_args(option), "examples/quickstart.yaml"])
    assert getattr(args, option.dest) == option.flag.example


@pytest.mark.parametrize("field", list(ROWS))
def test_a_flag_overrides_the_config_and_the_script_says_so(field, monkeypatch):
    monkeypatch.chdir(REPO)
    option = ROWS[field]
    config = load_config("examples/quickstart.yaml")
    if field == "mail_type":  # mail needs an address; the row's check says so
        config = from_dict({**config.to_dict(), "slurm": {"mail_user": "me@example.org"}})
    given = {option.dest: option.flag.example}
    script = jobscript.render(jobscript.JobSpec(config, "examples/quickstart.yaml"), options=given)
    assert options.with_options(config.slurm, given).__dict__[field] == option.flag.example
    assert " ".join(cli_args(option)).replace(" ", "=") in script.splitlines()[1]


def test_an_option_typo_lists_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        options.with_options(SlurmConfig(), {"constrain": "a100"})
    assert f"valid options: {', '.join(options.OPTIONS)}" in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown submission option\(s\) \['constrain'\]"):
        submission.resolve_config(Config(), (), {"constrain": "a100"})
    typo = r"unknown key slurm.time; valid keys: slurm.job_name, .* did you mean slurm.time_min\?"
    with pytest.raises(ConfigError, match=typo):
        from_dict({"slurm": {"time": 30}})


@pytest.mark.parametrize("field", [f for f, o in ROWS.items() if o.kind is str])
def test_text_sbatch_would_misread_is_refused_in_one_line_with_a_hint(field):
    with pytest.raises(ConfigError) as err:
        options.sbatch_options(SlurmConfig(**{**EXAMPLES, field: "two words"}))
    message = str(err.value)
    assert message.startswith(f"slurm.{field}='two words'")  # a row's own check may come first
    assert "HINT:" in message and "\n" not in message


def test_extra_may_not_set_what_a_row_sets():
    for option in options.TABLE:
        with pytest.raises(ConfigError, match=f"HINT: set slurm.{option.field} instead"):
            options.sbatch_options(SlurmConfig(extra={option.flag.sbatch: "x"}))


@pytest.mark.parametrize(
    "mail, message",
    [
        ({"mail_type": "END,FAILED", "mail_user": "me@example.org"}, "'FAILED' is not a Slurm"),
        ({"mail_type": "END"}, "slurm.mail_user is empty"),
    ],
)
def test_bad_mail_settings_get_one_line_with_a_hint(mail, message):
    with pytest.raises(ConfigError, match=message) as err:
        from_dict({"slurm": mail})
    assert "HINT:" in str(err.value) and "\n" not in str(err.value)


def test_mail_events_are_slurms_in_any_case_and_none_needs_no_address():
    slurm = SlurmConfig(mail_type="end,Fail,TIME_LIMIT_90", mail_user="me@example.org")
    assert "--mail-type=end,Fail,TIME_LIMIT_90" in sbatch_lines(slurm)
    assert "--mail-type=NONE" in sbatch_lines(SlurmConfig(mail_type="NONE"))


def test_a_boolean_row_is_a_bare_flag_or_nothing():
    assert "--exclusive" in sbatch_lines(SlurmConfig(exclusive=True))
    assert not [line for line in sbatch_lines(SlurmConfig()) if "exclusive" in line]
    args = parser().parse_args(["sbatch", "--no-exclusive", "examples/quickstart.yaml"])
    assert args.exclusive is False
    assert options.cli_flags({"exclusive": False, "nodes": 2}) == ["--no-exclusive", "--nodes=2"]
    with pytest.raises(ConfigError, match="slurm.exclusive must be bool"):
        from_dict({"slurm": {"exclusive": "yes please"}})
