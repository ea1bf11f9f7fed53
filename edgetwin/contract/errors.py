"""Errors that the CLI turns into one clear line and an exit code.

`InputError` means the user gave us something we cannot use (a file, a column, a flag): exit 2.
Anything else that goes wrong in a command is a failure: exit 1.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: names where (file, row, column or flag) and what was expected.

    Args:
        message: what is wrong and what was expected.
        where: the file, flag or ``file:row:column`` the problem is in, if known.
    """

    def __init__(self, message: str, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class GateRefused(RuntimeError):
    """A check the user asked for did not pass (e.g. a promotion gate): exit 1."""
