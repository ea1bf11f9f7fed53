"""Errors that the CLI turns into one clear line and an exit code.

The exit-code contract (DESIGN.md, "CLI"): 0 ok, 1 failed, 2 bad input, 3 the gate abstained.
Each error class says its code in ``exit_code``; `edgetwin.cli.exit_code_of` is the one place that
reads it (anything without one is an unexpected failure: exit 1).

- `InputError`: the user gave us something we cannot use (a file, a row, a column, a flag, a
  tampered artifact): exit 2.
- `GateRefused`: a check the user asked for did not pass (a promotion gate refused): exit 1.
- `GateAbstained`: the twin cannot tell (out of support, an interval straddling the margin): exit 3.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: names where (file, row, column or flag) and what was expected.

    Args:
        message: what is wrong and what was expected.
        where: the file, flag or ``file:row:column`` the problem is in, if known.
    """

    exit_code = 2

    def __init__(self, message: str, where: str | None = None) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)


class GateRefused(RuntimeError):
    """A check the user asked for did not pass (e.g. a promotion gate): exit 1."""

    exit_code = 1


class GateAbstained(RuntimeError):
    """The gate cannot tell whether the policy is better (the reason says why): exit 3."""

    exit_code = 3
