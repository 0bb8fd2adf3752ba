"""The user's code inside a run: calling a factory, and saying in one line what went wrong in it.

When a factory or the model's forward raises, the user needs their own frame, not forty lines of
hpcddp, DDP and gloo from every rank. Here such an error becomes one line naming the rank, its
host, the exception and the user's innermost frame (``file:line in function``); the traceback,
trimmed to the user's frames and what they called, is logged once, by the rank that failed.
A factory's signature is checked against its kwargs before the call, so a missing argument is a
config mistake with a fix, not a TypeError from deep inside the trainer.
"""

import inspect
import logging
import os
import pathlib
import sysconfig
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

import hpcddp
from hpcddp.comm.agreement import Fault
from hpcddp.errors import ConfigError, HpcddpError, UserCodeError
from hpcddp.launch.distenv import DistEnv

log = logging.getLogger(__name__)

_OURS = str(pathlib.Path(hpcddp.__file__).parent) + os.sep
# Frames of these are plumbing between the user's frames (module calls, DDP, the standard
# library); after the user's last frame they stay, since that is where the error was raised.
_LIBRARIES = tuple(
    {
        str(pathlib.Path(torch.__file__).parent) + os.sep,
        sysconfig.get_paths()["stdlib"] + os.sep,
        sysconfig.get_paths()["platstdlib"] + os.sep,
    }
)
_MESSAGE_CHARS = 300  # of the exception's own text, in the one line


def name_of(fn: Callable[..., Any]) -> str:
    """``module:function``, as a config names a factory."""
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}:{getattr(fn, '__qualname__', type(fn).__name__)}"


def call(fn: Callable[..., Any], kwargs: Mapping[str, Any], what: str, key: str) -> Any:
    """``fn(**kwargs)``, refused first if its signature cannot take them (``key`` names them)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have none: just call
        return fn(**kwargs)
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        raise ConfigError(
            f"{what} cannot be called with {key}={dict(kwargs)}: {err}. HINT: give every "
            f"argument it requires in {key} (or a default in the function), and only those it "
            f"takes; it is defined at {_definition(fn)}."
        ) from None
    return fn(**kwargs)


def is_user_file(filename: str) -> bool:
    """A frame of the user's code: not hpcddp, torch, the standard library or frozen code."""
    return not (filename.startswith((_OURS, *_LIBRARIES)) or filename.startswith("<"))


def trimmed_frames(err: BaseException) -> list[traceback.FrameSummary]:
    """From the user's first frame on: theirs, and what the last of them called (not ours)."""
    frames = traceback.extract_tb(err.__traceback__)
    mine = [i for i, f in enumerate(frames) if is_user_file(f.filename)]
    if not mine:
        return []
    return [
        f
        for i, f in enumerate(frames)
        if i >= mine[0]
        and not f.filename.startswith(_OURS)
        and (i >= mine[-1] or is_user_file(f.filename))
    ]


def trimmed_traceback(err: BaseException) -> str:
    """Python's traceback text, with only the frames of `trimmed_frames`."""
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(trimmed_frames(err))
    lines += traceback.format_exception_only(type(err), err)
    return "".join(lines).rstrip("\n")


def blame(err: BaseException, env: DistEnv, what: str) -> BaseException:
    """A `UserCodeError` for an error raised in the user's code; ``err`` itself otherwise.

    The trimmed traceback is logged here, once, by this rank (console and its log file).
    """
    if isinstance(err, HpcddpError) or not trimmed_frames(err):
        return err
    log.error("%s raised on rank %d:\n%s", what, env.rank, trimmed_traceback(err))
    return UserCodeError(_one_line(err, env, what))


def fault_of(err: BaseException, env: DistEnv, what: str) -> Fault:
    """What this rank tells the others at an agreement point about ``err``."""
    if isinstance(err, HpcddpError):
        return Fault(env.rank, env.hostname, type(err).__name__, str(err))
    if trimmed_frames(err):
        log.error("%s raised on rank %d:\n%s", what, env.rank, trimmed_traceback(err))
    else:  # raised inside hpcddp or torch itself: the whole traceback is the clue
        log.error("%s failed on rank %d", what, env.rank, exc_info=err)
    return Fault(env.rank, env.hostname, UserCodeError.__name__, _one_line(err, env, what))


def _one_line(err: BaseException, env: DistEnv, what: str) -> str:
    frames = [f for f in trimmed_frames(err) if is_user_file(f.filename)]
    at = f" at {_where(frames[-1])}" if frames else ""
    text = " ".join(str(err).split())[:_MESSAGE_CHARS]
    return (
        f"{what} raised on rank {env.rank} ({env.hostname}): {type(err).__name__}"
        f"{': ' + text if text else ''}{at}. HINT: fix your code there; the traceback, trimmed "
        f"to your code, is in RUN_DIR/logs/rank-{env.rank}.log and above."
    )


def _where(frame: traceback.FrameSummary) -> str:
    return f"{_shown(frame.filename)}:{frame.lineno} in {frame.name}"


def _shown(filename: str) -> str:
    """A path relative to the working directory when it lies below it (shorter, still exact)."""
    path = pathlib.Path(filename)
    try:
        return str(path.relative_to(pathlib.Path.cwd()))
    except ValueError:
        return filename


def _definition(fn: Callable[..., Any]) -> str:
    try:
        target = inspect.unwrap(fn)
        lines = inspect.getsourcelines(target)[1]
        return f"{_shown(inspect.getfile(target))}:{lines}"
    except (TypeError, OSError):
        return name_of(fn)
