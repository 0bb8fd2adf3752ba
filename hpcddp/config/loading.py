"""From YAML files and ``section.key=value`` overrides to a checked `Config`.

YAML is read with ``safe_load`` only; each value is checked against its field's type here, and
an unknown key names the valid ones and the closest match, so a typo fails at start-up.
"""

import dataclasses
import difflib
import functools
import math
import pathlib
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

import yaml

from hpcddp.config import safe_yaml
from hpcddp.config.sections import Config
from hpcddp.errors import ConfigError

_SCALARS = (bool, int, float, str)
MAX_CONFIG_BYTES = 1 << 20  # a config is a few kB; this refuses /dev/zero and data files fast


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass, field by field."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _origin(kind: Any) -> Any:
    """``dict[str, Any]`` -> ``dict``; plain types unchanged."""
    return typing.get_origin(kind) or kind


def type_name(kind: Any) -> str:
    """How a field's type is named in messages and in the reference: int, float, dict, ..."""
    if isinstance(kind, types.UnionType):  # str | bool: a choice that YAML may read as a bool
        return "|".join(map(type_name, typing.get_args(kind)))
    return str(getattr(_origin(kind), "__name__", kind))


def _coerce(value: Any, kind: Any, where: str) -> Any:
    """Check one value against its field's type, accepting ints where floats are expected."""
    declared, kind = kind, _origin(kind)
    if kind is float:
        return _finite(_float(value), where)
    if kind is str and type(value) is str and "\x00" in value:
        raise ConfigError(
            f"{where} contains a NUL byte ({value!r}). HINT: remove it; no path or name holds one."
        )
    if kind is list and type(value) is str:  # backends=tensorboard,wandb: a list, typed simply
        value = [item.strip() for item in value.split(",") if item.strip()]
    if kind is list and type(value) is list:
        return _items(value, declared, where)
    if kind in (*_SCALARS, dict) and type(value) is kind:
        return value
    if kind not in (*_SCALARS, dict, list):
        return value
    raise ConfigError(
        f"{where} must be {type_name(kind)}, got {type(value).__name__} {value!r}. "
        f"HINT: write it as a {type_name(kind)} in YAML or on the command line."
    )


def _items(values: list[Any], kind: Any, where: str) -> list[Any]:
    """Each item of a list field checked against the list's item type (``list[str]``)."""
    (item_kind,) = typing.get_args(kind) or (Any,)
    return [_coerce(item, item_kind, f"{where}[{i}]") for i, item in enumerate(values)]


def _float(value: Any) -> Any:
    """Ints, and strings YAML 1.1 left unread (``1e-3`` without a dot), as floats."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _finite(value: Any, where: str) -> Any:
    """A float that is a number: .nan and .inf would poison every step that uses them."""
    if not isinstance(value, float):
        raise ConfigError(
            f"{where} must be float, got {type(value).__name__} {value!r}. "
            "HINT: write it as a float in YAML or on the command line."
        )
    if not math.isfinite(value):
        raise ConfigError(
            f"{where} must be a finite number, got {value}. HINT: write a number (0 disables "
            "most options)."
        )
    return value


def _build(cls: type, data: Any, where: str) -> Any:
    """Make a dataclass from a mapping, naming unknown keys and the valid ones."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where or 'the config'} must be a mapping of keys to values, got "
            f"{type(data).__name__}. HINT: see examples/quickstart.yaml."
        )
    types_ = field_types(cls)
    unknown = sorted(set(map(str, data)) - set(types_))
    if unknown:
        prefix = f"{where}." if where else ""
        close = difflib.get_close_matches(unknown[0], list(types_), n=1)
        hint = f"did you mean {prefix}{close[0]}?" if close else "check the spelling."
        raise ConfigError(
            f"unknown key {prefix}{unknown[0]}; valid keys: "
            f"{', '.join(prefix + k for k in types_)}. HINT: {hint}"
        )
    values = {}
    for key, value in data.items():
        kind, path = types_[key], f"{where}.{key}" if where else key
        nested = dataclasses.is_dataclass(kind)
        values[key] = _build(kind, value, path) if nested else _coerce(value, kind, path)
    return cls(**values)


# The one rule for a key that names a setting: dotted identifiers (``optim.lr``,
# ``model.kwargs.hidden``), for overrides, job scripts and sweep grids alike.
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def key_path(key: str) -> list[str] | None:
    """``optim.lr`` -> ``["optim", "lr"]``; None when ``key`` cannot name a setting."""
    return key.split(".") if isinstance(key, str) and _KEY.fullmatch(key) else None


def split_override(text: str) -> tuple[list[str], str]:
    """``section.key=value`` -> (the key's path, the value's text), or a one-line ConfigError."""
    key, sep, raw = text.partition("=")
    path = key_path(key)
    if not sep or path is None:
        raise ConfigError(
            f"override {text!r} is not of the form section.key=value. "
            "HINT: e.g. optim.lr=0.01 train.epochs=3"
        )
    return path, raw


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b=value`` and read the value as YAML (so 3, 1e-3, true, [1, 2] keep their type);
    a string field keeps the text (``run.name=123``)."""
    path, raw = split_override(text)
    try:
        value = safe_yaml.load(raw, f"override {'.'.join(path)}") if raw else ""
    except yaml.YAMLError:
        value = raw
    if _is_str_field(path) and not isinstance(value, str):
        value = raw.strip()  # run.name=123 or run.dir= mean the text
    return path, value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Merge ``key=value`` overrides into raw config data (types are checked when built)."""
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {part} is not a section.")
        node[path[-1]] = value
    return data


def with_overrides(config: Config, overrides: Sequence[str]) -> Config:
    """``config`` with ``key=value`` overrides applied, checked again."""
    return with_values(config, [parse_override(text) for text in overrides])


def with_values(config: Config, values: Sequence[tuple[list[str], Any]]) -> Config:
    """``config`` with each setting (a key's path) given a value; every section touched is
    checked again by its ``__post_init__`` once all its values are in, so two settings checked
    against each other may change together. The config itself is left as it was."""
    changed: Config = _replaced(config, list(values), "")
    return changed


def _replaced(node: Any, values: list[tuple[list[str], Any]], where: str) -> Any:
    """A copy of ``node`` (the section or dict setting at ``where``) with the values set."""
    grouped: dict[str, list[tuple[list[str], Any]]] = {}
    for path, value in values:
        grouped.setdefault(path[0], []).append((path[1:], value))
    if isinstance(node, dict):
        return {
            **node,
            **{k: _setting(node.get(k, {}), None, v, where, k) for k, v in grouped.items()},
        }
    if not dataclasses.is_dataclass(node) or isinstance(node, type):
        raise ConfigError(f"{where} is not a section. HINT: see examples/quickstart.yaml.")
    section: type = type(node)
    kinds = field_types(section)
    for name in grouped:
        if name not in kinds:
            _build(section, {name: None}, where)  # raises, naming the valid keys
    changes = {
        name: _setting(getattr(node, name), kinds[name], items, where, name)
        for name, items in grouped.items()
    }
    try:
        return dataclasses.replace(node, **changes)
    except TypeError as err:
        raise ConfigError(f"invalid configuration: {err}") from None


def _setting(old: Any, kind: Any, items: list[tuple[list[str], Any]], where: str, name: str) -> Any:
    """One field's (or dict key's) new value: whole values and deeper keys, in order."""
    key = f"{where}.{name}" if where else name
    new = old
    for rest, value in items:
        if rest:
            new = _replaced(new, [(rest, value)], key)
        elif isinstance(kind, type) and dataclasses.is_dataclass(kind):
            new = _build(kind, value, key)
        elif kind is not None:
            new = _coerce(value, kind, key)
        else:
            new = value
    return new


def _is_str_field(path: list[str]) -> bool:
    """True when the override targets a string field (so `run.name=123` stays a string)."""
    cls: Any = Config
    for part in path:
        kinds = field_types(cls) if isinstance(cls, type) and dataclasses.is_dataclass(cls) else {}
        if part not in kinds:
            return False
        cls = kinds[part]
    return cls is str


def read_yaml(path: str | pathlib.Path) -> Any:
    """Load one YAML file safely, turning every failure into a one-line ConfigError."""
    path = pathlib.Path(path)
    text = read_text(path)
    try:
        data = safe_yaml.load(text, str(path))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"config {path} is not valid YAML{where}: "
            f"{getattr(err, 'problem', err)}. HINT: fix the YAML syntax there."
        ) from None
    return data if data is not None else {}


def read_text(path: pathlib.Path) -> str:
    """The file as UTF-8 text, refused in one line when it is missing, huge or not text."""
    if "\x00" in str(path):
        raise ConfigError(f"config path {str(path)!r} contains a NUL byte. HINT: fix the path.")
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(
            f"cannot read config {path}: {err.strerror}. "
            "HINT: check the path (examples/quickstart.yaml is one)."
        ) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config {path} is larger than {MAX_CONFIG_BYTES >> 20} MiB, so it is not a config. "
            "HINT: pass the YAML config file, and put data paths in data.kwargs."
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError(
            f"config {path} is not UTF-8 text (byte 0x{raw[err.start]:02x} on line {line}). "
            "HINT: save it as UTF-8 (iconv -f latin1 -t utf-8, or your editor's encoding menu)."
        ) from None


def load_config(path: str | pathlib.Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML file (or start from defaults), apply overrides, check every value."""
    data = read_yaml(path) if path else {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config {path} must be a mapping of sections, got "
            f"{type(data).__name__}. HINT: see examples/quickstart.yaml."
        )
    return from_dict(apply_overrides(data, list(overrides)))


def from_dict(data: dict[str, Any]) -> Config:
    """Build a checked Config from plain data (e.g. a saved ``config.yaml``)."""
    try:
        config: Config = _build(Config, data, "")
    except TypeError as err:  # a dataclass refused an argument we did not anticipate
        raise ConfigError(f"invalid configuration: {err}") from None
    return config
