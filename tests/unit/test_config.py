"""Configuration: YAML and overrides onto checked dataclasses, with errors that name the fix."""

import dataclasses

import pytest
import yaml

from hpcddp.cli import main
from hpcddp.config import (
    Config,
    from_dict,
    key_path,
    load_config,
    reference,
    split_override,
    with_overrides,
)
from hpcddp.config.loading import field_types, type_name
from hpcddp.config.sections import field_help
from hpcddp.errors import ConfigError
from tests.fixtures.helpers import REPO

QUICKSTART = REPO / "examples" / "quickstart.yaml"


def test_quickstart_loads_and_round_trips_through_yaml():
    config = load_config(QUICKSTART)
    assert config.model.factory == "examples.quickstart:make_model"
    assert from_dict(yaml.safe_load(config.to_yaml())) == config


def test_overrides_keep_their_types():
    config = load_config(
        QUICKSTART,
        [
            "optim.lr=1e-2",
            "train.epochs=7",
            "run.name=123",
            "data.drop_last=true",
            "model.kwargs={hidden: 8}",
            "optim.weight_decay=0",
        ],
    )
    assert config.optim.lr == 0.01 and isinstance(config.optim.weight_decay, float)
    assert config.train.epochs == 7 and config.run.name == "123"
    assert config.data.drop_last is True and config.model.kwargs == {"hidden": 8}


def test_defaults_need_no_file():
    assert load_config(None) == Config()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.lrr=1"], r"unknown key optim.lrr; valid keys: optim.name, optim.lr,"),
        (["trian.epochs=1"], r"unknown key trian; valid keys: run, model, data"),
        (["optim.lr=fast"], r"optim.lr must be float, got str 'fast'"),
        (["train.epochs=1.5"], r"train.epochs must be int, got float 1.5"),
        (["data.drop_last=3"], r"data.drop_last must be bool, got int 3"),
        (["train.epochs=0"], r"train.epochs must be > 0, got 0"),
        (["data.batch_size=-4"], r"data.batch_size must be > 0, got -4"),
        (["optim.lr=0"], r"optim.lr must be > 0"),
        (["slurm.nodes=0"], r"slurm.nodes must be > 0"),
        (["dist.timeout_s=-1"], r"dist.timeout_s must be > 0"),
        (["train.precision=fp8"], r"train.precision='fp8' is not one of"),
        (["optim.name=lamb"], r"optim.name='lamb' is not one of"),
        (["dist.backend=mpi"], r"dist.backend='mpi' is not one of"),
        (["model.factory=nocolon"], r"must look like 'package.module:function'"),
        (["lr=0.1"], r"unknown key lr"),
        (["optim=3"], r"optim must be a mapping"),
        (["=3"], r"is not of the form section.key=value"),
        (["optim..lr=3"], r"is not of the form section.key=value"),
        (["data.num_workers=-2"], r"data.num_workers must be >= 0"),
        (["optim.lr.x=1"], r"override 'optim.lr.x=1': lr is not a section"),  # a value, not a dict
        (["slurm.container={runtime: apptainer}"], r"runtime=apptainer needs an image"),
        (
            ['slurm.setup=["module load a\\nsource b"]'],
            r"slurm.setup lines may not contain newlines",
        ),
    ],
)
def test_bad_values_are_one_line_errors_with_a_hint(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(QUICKSTART, overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("run: {dir: [unclosed\n", r"not valid YAML at line \d+"),
        ("- a\n- b\n", r"must be a mapping of sections, got list"),
        ("run:\n  dir: x\n  dir2: y\n", r"unknown key run.dir2"),
        ("!!python/object/apply:os.system ['true']\n", r"not valid YAML"),  # safe_load only
    ],
)
def test_bad_files(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_missing_file():
    with pytest.raises(ConfigError, match=r"cannot read config /nonexistent.yaml"):
        load_config("/nonexistent.yaml")


# --- the reference: every field documented once, beside the field ------------------------


def _every_field(cls=Config, prefix=""):
    """(dotted key, field, class that declares it) for every leaf field, nested sections too."""
    for field in dataclasses.fields(cls):
        kind, key = field_types(cls)[field.name], f"{prefix}{field.name}"
        if not dataclasses.is_dataclass(kind):
            yield key, field, cls
        elif cls is Config:
            yield from _every_field(kind, f"{key}.")
        else:  # a section inside a section (slurm.container) is documented and expanded
            assert len(field_help(field)) >= 8, f"{key} has no help"
            yield from _every_field(kind, f"{key}.")


def test_every_field_says_what_it_is_for():
    missing = [key for key, field, _ in _every_field() if len(field_help(field)) < 8]
    assert not missing, f"fields without help: {missing}"


def test_help_config_lists_every_key_with_type_default_and_help(capsys):
    assert main(["train", "--help-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for key, field, owner in _every_field():
        line = next((line for line in lines if line.split()[:1] == [key]), None)
        assert line is not None, f"{key} missing from --help-config"
        assert line.rstrip().endswith(field_help(field))
        assert line.split()[1] == type_name(field_types(owner)[field.name])


def test_the_docs_reference_is_generated_from_the_fields():
    page = (REPO / reference.PAGE).read_text()
    assert reference.as_markdown() in page, (
        f"the configuration reference in {reference.PAGE} is stale. "
        "HINT: run `python -m hpcddp.config.reference` and commit the result."
    )


def test_regenerating_the_reference_keeps_the_rest_of_the_file(tmp_path):
    page = tmp_path / "configuration.md"
    page.write_text(f"# title\n\nbefore\n\n{reference.BEGIN}\nold\n{reference.END}\n\nafter\n")
    assert reference.main([str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# title\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert reference.as_markdown() in text and "\nold\n" not in text


# -- one stop margin, one override-key rule, overrides on a Config ---------------------------


def test_slurms_signal_may_not_come_before_the_trainers_stop_margin():
    with pytest.raises(
        ConfigError,
        match=r"slurm.signal_delay_s=300 is longer than "
        r"train.stop_before_end_s=120.*HINT: raise train.stop_before_end_s",
    ):
        load_config(None, ["slurm.signal_delay_s=300"])
    both = load_config(None, ["slurm.signal_delay_s=300", "train.stop_before_end_s=300"])
    assert (both.slurm.signal_delay_s, both.train.stop_before_end_s) == (300, 300)
    assert load_config(None, ["train.stop_before_end_s=150"]).slurm.signal_delay_s == 120


@pytest.mark.parametrize("key", ["optim.lr", "model.kwargs.hidden_2", "_x"])
def test_one_rule_for_keys(key):
    assert key_path(key) == key.split(".")


@pytest.mark.parametrize("key", ["", "optim.", ".lr", "optim..lr", "1x", "optim.l r", "a-b", "é"])
def test_keys_that_name_no_setting_are_refused_everywhere(key):
    from hpcddp.slurm import grid, jobscript

    assert key_path(key) is None
    with pytest.raises(ConfigError, match="is not of the form section.key=value"):
        split_override(f"{key}=1")
    with pytest.raises(ConfigError, match="is not of the form section.key"):
        jobscript.render(jobscript.JobSpec(Config(), None, [f"{key}=1"]))
    with pytest.raises(ConfigError, match="is not of the form section.key"):
        grid.sweep_points({key: [1]})


def test_overrides_on_a_config_equal_overrides_on_its_yaml_and_leave_it_alone():
    texts = ["optim.lr=0.5", "run.name=123", "model.kwargs.hidden=7", "slurm.nodes=3"]
    base = load_config("examples/quickstart.yaml")
    changed = with_overrides(base, texts)
    assert changed == load_config("examples/quickstart.yaml", texts)
    assert changed.run.name == "123" and base.optim.lr != 0.5  # the original is untouched
    with pytest.raises(ConfigError, match="unknown key optim.lrr.*did you mean optim.lr"):
        with_overrides(base, ["optim.lrr=1"])
    with pytest.raises(ConfigError, match="slurm.nodes must be > 0"):
        with_overrides(base, ["slurm.nodes=0"])
    with pytest.raises(ConfigError, match="optim.lr is not a section"):
        with_overrides(base, ["optim.lr.x=1"])
