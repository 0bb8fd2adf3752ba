"""Import user code by path (``package.module:function``) so it needs no changes to hpcddp."""

import importlib
import sys
import traceback
from collections.abc import Callable
from typing import Any

from hpcddp.errors import ConfigError


def import_factory(path: str, what: str) -> Callable[..., Any]:
    """Return the callable named by ``package.module:function``, or say why it cannot be had."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(
            f"{what} factory {path!r} must look like 'package.module:function'. "
            "HINT: e.g. examples.quickstart:make_model"
        )
    if "" not in sys.path:  # `python -m`/console scripts may not look in the working directory
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            f"{what} factory {path!r}: cannot import {module_name!r} ({err}). "
            "HINT: run from the directory that contains it or add it to "
            "PYTHONPATH."
        ) from None
    except Exception as err:  # the user's module itself raised (or does not parse) on import
        raise ConfigError(
            f"{what} factory {path!r}: importing {module_name!r} raised "
            f"{type(err).__name__}: {' '.join(str(err).split())[:300]}{_where(err)}. "
            "HINT: fix that module; `python -c 'import "
            f"{module_name}'` shows the whole traceback."
        ) from None
    factory: Any = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ConfigError(
                f"{what} factory {path!r}: {module_name!r} has no {attr!r}. "
                f"HINT: check the name after ':'."
            )
    if not callable(factory):
        raise ConfigError(
            f"{what} factory {path!r} names a {type(factory).__name__}, not a function. "
            "HINT: name the function (or class) that builds it, after the ':'."
        )
    return factory


def _where(err: BaseException) -> str:
    """`` at file:line``: where the module failed (the innermost frame, or the syntax error)."""
    if isinstance(err, SyntaxError) and err.filename:
        return f" at {err.filename}:{err.lineno}"
    frames = traceback.extract_tb(err.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
