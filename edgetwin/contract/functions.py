"""`resolve_function_ref`: the operator's own code a spec names as ``"module:function"``.

A spec may name functions (``[transition]``, ``[reward]``, ``[[dynamics]]``); each is imported
here, when the spec is validated, so that a reference that cannot be imported is an error naming
the spec file and entry before any fit, not halfway through ``train``.

**Only where the user allowed it.** Importing a module runs its code, and a spec travels inside
every twin and policy directory, so a name in a file is never enough: a module is imported only
when the user allowed it on this machine, in one of three ways (a module allows its submodules):

* ``EDGETWIN_ALLOW_CODE=mypkg,other.mod`` in the environment;
* a line ``mypkg`` in the allow-list file, ``$EDGETWIN_CONFIG_DIR/allow-code`` (default
  ``$XDG_CONFIG_HOME/edgetwin/allow-code``, i.e. ``~/.config/edgetwin/allow-code``; ``#`` starts a
  comment);
* ``--allow-code mypkg`` on ``edgetwin fit`` / ``edgetwin logs validate``, for a spec the user
  gives on the command line (`allow_code`, for this process).

Anything else is refused (`InputError`, exit 2) with one line that says how to allow it, before the
module is imported.

**Allowing a module allows the functions it defines, nothing reachable through it.** The attribute
path after ``:`` is public names only (no ``_``/dunder part), never passes through a module (the
allowed module's own ``import os`` does not make ``mymod:os.system`` allowed), and the callable it
ends at must be defined in an allowed module (its ``__module__``): ``mymod:getoutput`` after
``from subprocess import getoutput`` in ``mymod`` is refused, as ``mymod:__builtins__.get`` is. edgetwin's own functions that its built-in specs name (:data:`BUILTIN_REFS`)
need no allowance.
"""

from __future__ import annotations

import importlib
import os
import re
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from edgetwin.contract.errors import InputError

__all__ = ["ALLOW_ENV", "BUILTIN_REFS", "allow_code", "allow_list_file", "allowed_modules", "resolve_function_ref"]

#: The environment variable that allows modules (comma-separated).
ALLOW_ENV = "EDGETWIN_ALLOW_CODE"
#: Function references of edgetwin's own built-in specs, allowed without asking (exact references).
BUILTIN_REFS = frozenset({"edgetwin.emulator.dag.logs:erlfc_reward"})
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def allow_list_file() -> Path:
    """The allow-list file: ``$EDGETWIN_CONFIG_DIR/allow-code``, default
    ``$XDG_CONFIG_HOME/edgetwin/allow-code`` (``~/.config/edgetwin/allow-code``)."""
    base = os.environ.get("EDGETWIN_CONFIG_DIR")
    if base:
        return Path(base) / "allow-code"
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(xdg) / "edgetwin" / "allow-code"


def allow_code(modules: Iterable[str], where: str = "--allow-code") -> None:
    """Allow ``modules`` (and their submodules) to be imported for spec functions in this process
    and the processes it starts (they are added to ``EDGETWIN_ALLOW_CODE``, which pool workers
    inherit).

    Raises:
        InputError: a name that is not a dotted Python module name (naming ``where``).
    """
    names = list(modules)
    for m in names:
        if not isinstance(m, str) or not _MODULE.match(m):
            raise InputError(f"{m!r} is not a module name (e.g. mypkg or mypkg.rewards)", where)
    have = [m.strip() for m in os.environ.get(ALLOW_ENV, "").split(",") if m.strip()]
    os.environ[ALLOW_ENV] = ",".join(dict.fromkeys([*have, *names]))


def allowed_modules() -> set[str]:
    """Every module allowed on this machine now: ``EDGETWIN_ALLOW_CODE`` (with `allow_code`'s) and
    the allow-list file."""
    out = {m.strip() for m in os.environ.get(ALLOW_ENV, "").split(",") if m.strip()}
    try:
        lines = allow_list_file().read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    out.update(ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip())
    return out


def _is_allowed(module: str, ref: str) -> bool:
    if ref in BUILTIN_REFS:
        return True
    return any(module == m or module.startswith(m + ".") for m in allowed_modules())


def resolve_function_ref(ref: Any, *, spec_path: str | Path | None = None, entry: str = "function") -> Callable[..., Any]:
    """Import and return the callable a spec names as ``"module:function"``.

    Used when a spec is validated (so ``logs validate`` and ``fit`` catch a reference that cannot be
    imported, instead of ``train`` failing later) and when the function is finally called.

    Args:
        ref: the reference from the spec, e.g. ``"mypkg.rewards:reward"``.
        spec_path: the spec file, named in the error.
        entry: which entry holds it, e.g. ``"[transition] function"`` or ``"[reward] function"``.

    Raises:
        InputError: naming the spec file and entry: not ``module:function``, the module is not
            allowed on this machine (see the module docstring; it is then never imported), it
            cannot be imported (or raises while importing), no such attribute, or it is not callable.
    """
    where = str(spec_path) if spec_path is not None else "spec"
    if not isinstance(ref, str):
        raise InputError(f"{entry} must be a 'module:function' string, got {ref!r}", where)
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise InputError(f"{entry} must be 'module:function', got {ref!r}", where)
    if not _MODULE.match(module):
        raise InputError(f"{entry} {ref!r}: {module!r} is not a module name", where)
    if not _is_allowed(module, ref):
        raise InputError(
            f"{entry} {ref!r}: module {module!r} is not allowed to run on this machine (a spec names code, it "
            f"does not vouch for it); allow it with --allow-code {module} (fit, logs validate), "
            f"{ALLOW_ENV}={module}, or a line {module} in {allow_list_file()}",
            where,
        )
    try:
        top = obj = importlib.import_module(module)
    except Exception as e:  # ImportError, or anything the module raises while importing
        raise InputError(f"{entry} {ref!r}: module {module!r} cannot be imported ({type(e).__name__}: {e})", where) from None
    for part in attr.split("."):
        if not part.isidentifier() or part.startswith("_"):
            raise InputError(f"{entry} {ref!r}: {part!r} is not a public name of {module!r} (no private or dunder "
                             "attribute is reachable from a spec)", where)  # fmt: skip
        if isinstance(obj, types.ModuleType) and obj is not top:
            raise InputError(f"{entry} {ref!r}: the path goes through the module {obj.__name__!r}, which {module!r} "
                             "imports but does not define: allowing a module allows only what it defines", where)  # fmt: skip
        if not hasattr(obj, part):
            raise InputError(f"{entry} {ref!r}: module {module!r} has no {attr!r}", where)
        obj = getattr(obj, part)
    if isinstance(obj, types.ModuleType):
        raise InputError(f"{entry} {ref!r} names a module, not a function", where)
    if not callable(obj):
        raise InputError(f"{entry} {ref!r} is not callable", where)
    defined_in = getattr(obj, "__module__", None)
    if not isinstance(defined_in, str) or not (ref in BUILTIN_REFS or _is_allowed(defined_in, "")):
        raise InputError(
            f"{entry} {ref!r}: {attr!r} is defined in {defined_in!r}, not in the allowed module {module!r} (it only "
            "imports it): allowing a module allows the functions it defines, nothing reachable through it",
            where,
        )
    return obj
