"""Functions that tests hand to a spawned process pool (`edgetwin.twin.parallel.run_tasks`).

A pool worker unpickles a task's function by reference, i.e. it imports the module that defines
it. Defined in a test module, that is the test module and all it imports (torch, the twin, the
emulator: ~9 s of CPU per worker on the project's 2-core machine, measured with `python3 -X
importtime`); from here, the worker imports only this module.
"""

from __future__ import annotations

import os


def square_plus(offset: int, k: int) -> int:
    """``k * k + offset`` (a task whose result shows both its own and the shared argument)."""
    return k * k + offset


def tagged(offset: int, k: int) -> tuple[int, int]:
    """(``offset + k**2``, the id of the process that ran it)."""
    return offset + k * k, os.getpid()
