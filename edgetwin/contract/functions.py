"""`resolve_function_ref`: the operator's own code a spec names as ``"module:function"``.

A spec may name functions (``[transition]``, ``[reward]``, ``[[dynamics]]``); each is imported
here, when the spec is validated, so that a reference that cannot be imported is an error naming
the spec file and entry before any fit, not halfway through ``train``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgetwin.contract.errors import InputError

__all__ = ["resolve_function_ref"]


def resolve_function_ref(ref: Any, *, spec_path: str | Path | None = None, entry: str = "function") -> Callable[..., Any]:
    """Import and return the callable a spec names as ``"module:function"``.

    Used when a spec is validated (so ``logs validate`` and ``fit`` catch a reference that cannot be
    imported, instead of ``train`` failing later) and when the function is finally called.

    Args:
        ref: the reference from the spec, e.g. ``"mypkg.rewards:reward"``.
        spec_path: the spec file, named in the error.
        entry: which entry holds it, e.g. ``"[transition] function"`` or ``"[reward] function"``.

    Raises:
        InputError: naming the spec file and entry: not ``module:function``, the module cannot be
            imported (or raises while importing), no such attribute, or it is not callable.
    """
    where = str(spec_path) if spec_path is not None else "spec"
    if not isinstance(ref, str):
        raise InputError(f"{entry} must be a 'module:function' string, got {ref!r}", where)
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise InputError(f"{entry} must be 'module:function', got {ref!r}", where)
    try:
        obj: Any = importlib.import_module(module)
    except Exception as e:  # ImportError, or anything the module raises while importing
        raise InputError(f"{entry} {ref!r}: module {module!r} cannot be imported ({type(e).__name__}: {e})", where) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{entry} {ref!r}: module {module!r} has no {attr!r}", where)
        obj = getattr(obj, part)
    if not callable(obj):
        raise InputError(f"{entry} {ref!r} is not callable", where)
    return obj
