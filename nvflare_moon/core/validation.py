"""Argument checks shared by every component, with messages that name the argument and its valid range."""

import dataclasses
import importlib
import math
import os
import sys
import warnings
from typing import Any, Dict, Iterable, Optional

# A header on a task: the server refuses the job (the reason is its value); executors answer with a failed reply.
JOB_REFUSED_HEADER = "nvflare_moon.job_refused"


def check_number(
    name: str, value: Any, *, low: Optional[float] = None, low_inclusive: bool = True, integer: bool = False
) -> None:
    """Raise ValueError unless ``value`` is a finite number (an int if ``integer``) above ``low``."""
    kind = "an integer" if integer else "a number"
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value):
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    if low is not None and (value < low or (value == low and not low_inclusive)):
        bound = f">= {low}" if low_inclusive else f"> {low}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def check_flag(name: str, value: Any) -> None:
    """Raise ValueError unless ``value`` is True or False (not 0, 1 or a string)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def check_module(name: str, value: Any) -> None:
    """Raise ValueError, naming the argument, unless ``value`` is a torch ``nn.Module``."""
    from torch import nn  # here: the checks above serve code that never imports torch (verify-docs)

    if not isinstance(value, nn.Module):
        raise ValueError(
            f"{name} must be an nn.Module (such as nvflare_moon.models.Network), got {type(value).__name__}"
        )


def check_choice(name: str, value: Any, choices: Iterable[str]) -> None:
    choices = sorted(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_optional_choice(name: str, value: Any, choices: Iterable[str], *, module: str, needs: str) -> None:
    """Raise ValueError unless ``value`` is None (the option is off), or one of ``choices`` with ``module``
    importable here; the message names the option and what to install (``needs``)."""
    if value is None:
        return
    if value not in choices:
        raise ValueError(f"{name} must be None or one of {list(choices)}, got {value!r}")
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{name}={value!r} needs {needs}: {e}") from e


def take_renamed(kwargs: Dict[str, Any], old: str, new: str, value: Any, default: Any, *, owner: str) -> Any:
    """The value of the argument ``new``, or, for one release, of its old name ``old`` taken out of ``kwargs`` with a
    DeprecationWarning. Raises TypeError when both are given."""
    if old not in kwargs:
        return value
    old_value = kwargs.pop(old)
    if value != default:
        raise TypeError(f"{owner}: give {new} alone, not {new} and {old} (the old name of {new})")
    warnings.warn(
        f"{owner}({old}=...) is deprecated and will be removed in the next release: use {new}=...",
        DeprecationWarning,
        stacklevel=users_stacklevel(),
    )
    return old_value


def reject_unknown(owner: str, kwargs: Dict[str, Any]) -> None:
    """Raise a TypeError for unexpected keyword arguments, naming ``owner`` and every name left in ``kwargs`` (a
    constructor's ``**kwargs`` after its old names were taken out)."""
    if kwargs:
        raise TypeError(f"{owner} got unexpected keyword argument(s) {', '.join(sorted(kwargs))}")


def users_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the user's line: the first caller outside ``nvflare_moon`` and
    NVFlare (whose ``set_per_site_config`` calls our recipes back), however many constructors stand between."""
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    nvflare = sys.modules.get("nvflare")  # not imported: none of its frames can be on the stack
    packages = (ours, os.path.dirname(os.path.abspath(nvflare.__file__)) + os.sep) if nvflare else (ours,)
    frame, level = sys._getframe(2), 2  # level 1: the function that warns
    while frame is not None and (frame.f_code.co_filename.startswith(packages) or _generated_init(frame.f_code)):
        frame, level = frame.f_back, level + 1
    return level


def _generated_init(code) -> bool:
    """Whether ``code`` is the ``__init__`` that ``dataclasses`` writes for a class (a recipe's), or
    ``dataclasses.replace``, which calls it."""
    return (code.co_name == "__init__" and code.co_filename == "<string>") or code.co_filename == dataclasses.__file__
