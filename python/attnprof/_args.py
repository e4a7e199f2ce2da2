"""The one path every argument of attnprof's calls takes to the library.

Here only the type is checked, the same way for every argument: a number is an int or a float (or anything with
__index__ or __float__: numpy scalars, 0-d tensors) and never a bool, a whole number fits the C++ integer it
becomes, a name is a str, a flag is True or False. A value of the wrong type raises ArgumentTypeError, which is
both an attnprof.Error and a TypeError, in one line naming the argument. The value itself (a range, a name the
library knows) is checked once, by the library, whose message names the field.
"""

from __future__ import annotations

import os

from ._core import Error

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT64 = (0, 2**64 - 1)


class ArgumentTypeError(Error, TypeError):
    """An argument of the wrong type (a bool for a number, None for a name): an attnprof.Error and a TypeError."""


def _shown(value) -> str:
    """The value as a message shows it: its type and a repr cut to one short line (an array's runs to many)."""
    text = repr(value)
    lines = text.splitlines() or [""]
    if len(lines) > 1 or len(text) > 60:
        text = lines[0][:60] + " ..."
    return f"{type(value).__name__} {text}"


def is_bool(value) -> bool:
    """True, False, numpy's bool_ and a bool tensor or array: values that float() and __index__ would take as
    0 or 1, and that no numeric argument means."""
    if isinstance(value, bool):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and str(dtype) in ("bool", "torch.bool")


def whole(name: str, value, bounds=INT32, optional: bool = False):
    """A whole number the C++ side holds in `bounds` (int32 unless given), or None where optional."""
    if value is None and optional:
        return None
    if is_bool(value) or not hasattr(value, "__index__"):
        raise ArgumentTypeError(f"{name} must be a whole number, got {_shown(value)}")
    v = value.__index__()
    if not bounds[0] <= v <= bounds[1]:
        raise Error(f"{name} is out of range: {v} is past the {bounds[0]} to {bounds[1]} it is held in")
    return v


def real(name: str, value, optional: bool = True):
    """A number as a float (a double), or None where optional; its range is the library's to check."""
    if value is None and optional:
        return None
    if is_bool(value) or not (hasattr(value, "__float__") or hasattr(value, "__index__")):
        raise ArgumentTypeError(f"{name} must be a number, got {_shown(value)}")
    try:
        return float(value)
    except OverflowError:
        raise Error(f"{name} is out of range: {_shown(value)} is past a double's range") from None
    except (TypeError, ValueError):  # an array of more than one element
        raise ArgumentTypeError(f"{name} must be a number, got {_shown(value)}") from None


def text(name: str, value, optional: bool = False):
    """A name (a backend, a mask, a layout, a dtype ...) as a str, or None where optional."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a string, got {_shown(value)}")
    return value


def flag(name: str, value) -> bool:
    """True or False (numpy's bool_ too)."""
    if value is True or value is False:
        return value
    if is_bool(value) and getattr(value, "shape", ()) == ():
        return bool(value)
    raise ArgumentTypeError(f"{name} must be True or False, got {_shown(value)}")


def path(name: str, value, optional: bool = True):
    """A file or folder as a str (a pathlib.Path too), or None where optional."""
    if value is None and optional:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a path (a str or os.PathLike), got {_shown(value)}")
    return value


def names(name: str, value) -> list[str]:
    """A list of names: None is none, one str is one name (never its letters), else each item a str."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    try:
        items = list(value)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be a name or a list of names, got {_shown(value)}") from None
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ArgumentTypeError(f"{name}[{i}] must be a string (a backend's name), got {_shown(item)}")
    return items


def lengths(name: str, value):
    """A packed batch's lengths as a list of whole numbers (None: a dense batch); their range is the library's."""
    if value is None:
        return None
    if isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a list of whole numbers, got {_shown(value)}")
    try:
        items = list(value)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be a list of whole numbers, got {_shown(value)}") from None
    return [whole(f"{name}[{i}]", n, INT64) for i, n in enumerate(items)]
