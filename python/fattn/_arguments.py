"""flash-attn's scalar arguments as the public functions accept them.

flash-attn takes whatever unpacks to the numbers it needs: `window_size` as a tuple, a list, a
tensor of two ints (its own tests pass `torch.randint(0, seqlen, (2,))`) or numpy ints; lengths as
ints, numpy ints or 0-d integer tensors (transformers passes `max_length_q` as one). The ops'
schemas take plain Python ints, floats and bools, and would answer anything else with a schema
error that names neither the caller's argument nor the fix. These turn each argument into the
plain value once, at the public function, or raise an error that names the argument.

Symbolic values (torch.compile) pass through unchanged: the ops' own checks guard them.
"""

from __future__ import annotations

import numbers
import operator

import torch

from ._checks import fail

# A window side this wide hides nothing at any length a tensor can have, so it means what -1
# means; the clamp keeps wider values (2**64 from a careless caller) within the ops' int64.
WIDEST_WINDOW = 2**62


def _is_numpy_bool(value) -> bool:
    """numpy's bool scalar (numpy.bool_, named numpy.bool from numpy 2), without importing numpy."""
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")


def _type_error(fn: str, name: str, expected: str, value) -> TypeError:
    return TypeError(f"fattn.{fn}: {name} must be {expected}, got {value!r} ({type(value).__name__})")


def integer(fn: str, name: str, value, minimum: int | None = None):
    """An int from an int, a numpy integer or a one-element integer tensor; bools and floats are
    refused (4.0 is not a length). A CUDA tensor is read on the host."""
    if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
        number = value  # (what torch.compile traces: a symbolic length stays symbolic)
    elif isinstance(value, (bool, float)) or _is_numpy_bool(value) or not hasattr(type(value), "__index__"):
        raise _type_error(fn, name, "an int", value)
    else:
        try:
            number = operator.index(value)
        except TypeError:  # a float tensor, or one of several elements
            raise _type_error(fn, name, "an int", value) from None
    if minimum is not None and number < minimum:
        fail(f"fattn.{fn}", name, " is ", number, "; expected >= ", minimum)
    return number


def real(fn: str, name: str, value, allow_none: bool = False):
    """A float from a Python or numpy real number (ints included); None where allow_none."""
    if value is None and allow_none:
        return None
    if isinstance(value, (torch.SymFloat, torch.SymInt)):
        return value
    if isinstance(value, bool) or _is_numpy_bool(value) or not isinstance(value, numbers.Real):
        raise _type_error(fn, name, "a number" + (" or None" if allow_none else ""), value)
    return float(value)


def flag(fn: str, name: str, value) -> bool:
    """A bool from a Python or numpy bool (what flash-attn's bindings take)."""
    if isinstance(value, bool):
        return value
    if _is_numpy_bool(value):
        return bool(value)
    if isinstance(value, torch.SymBool):
        return value
    raise _type_error(fn, name, "a bool", value)


def window_pair(fn: str, window_size) -> tuple[int, int]:
    """flash-attn's window_size: (left, right), -1 unbounded on that side, in any form that unpacks
    to two ints. The one window rule of every public function: each side is -1 or >= 0, and a side
    wider than any sequence means unbounded. A bare int is refused rather than guessed at: (w, w)
    and (w, 0) are both common meanings."""
    pair = None
    if isinstance(window_size, torch.Tensor):
        if window_size.dim() == 1 and window_size.shape[0] == 2:
            pair = window_size.tolist()
    elif not isinstance(window_size, (str, bytes, numbers.Number)) and hasattr(window_size, "__len__") \
            and hasattr(window_size, "__getitem__") and len(window_size) == 2:
        pair = window_size
    try:
        if pair is None:
            raise TypeError
        left, right = integer(fn, "window_size", pair[0]), integer(fn, "window_size", pair[1])
    except TypeError:
        raise TypeError(f"fattn.{fn}: window_size must be a (left, right) pair of ints, -1 for unbounded, "
                        f"got {window_size!r}") from None
    if any(isinstance(side, int) and side < -1 for side in (left, right)):
        fail(f"fattn.{fn}", "window_size is (", left, ", ", right, "); expected each side -1 (unbounded) or >= 0")
    return tuple(min(side, WIDEST_WINDOW) if isinstance(side, int) else side for side in (left, right))

