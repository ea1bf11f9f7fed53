"""edgetwin: learn a digital twin of an edge-cloud scheduling system from its logs.

Subpackages are layered (DESIGN.md, "Layout: one package, layered"); each imports only from the
layers before it: ``contract`` (1) <- ``generative``, ``imitation`` (2) <- ``twin`` (3) <-
``policies`` (4) <- ``emulator`` (5) <- ``edge`` (6) <- ``loop``, ``federation`` (7) <- ``cli``, ``demo`` (8).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("edgetwin")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["__version__", "lazy_exports"]

# stable-baselines3 imports the old `gym` package whenever it is installed (d3rlpy, the OPE baseline,
# depends on it) only to convert old-gym environments, which edgetwin never passes it; gym's import
# then prints a deprecation notice to stderr (gym_notices) that tells an edgetwin user nothing and
# would open every command's output, the demo's twice (its spawned worker imports SB3 too). Only
# that notice is skipped, and only when gym was not imported before edgetwin: gym itself still
# imports and warns through `warnings` as usual.
if "gym" not in sys.modules:
    sys.modules.setdefault("gym_notices", None)  # type: ignore[arg-type]


def lazy_exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module-level ``__getattr__`` and ``__dir__`` (PEP 562) for its public names.

    Each name in ``where`` (name -> the module that defines it) is imported on first use, so that
    importing one light module of a package (``edgetwin.contract.errors`` for the CLI's start-up)
    does not import all of it (pandas, torch). The layout test reads ``where`` as imports.
    """

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*vars(import_module(package)), *where])

    return __getattr__, __dir__
