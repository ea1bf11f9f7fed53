"""The ``edgetwin`` entry point: every command group registered on the root `app`, and errors turned
into exit codes.

0 ok / 1 failed / 2 bad input / 3 the gate abstained. `exit_code_of` is the one place that decides the
code and `describe_error` the one line that is printed, literally (no console markup); set
``EDGETWIN_DEBUG=1`` to also see the traceback.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

import typer

# isort: off
# importing a group module registers its commands on `app`, in the pipeline's order (the order of --help)
from edgetwin.cli import logs, registry, demo, twin, policy, edge, federation  # noqa: F401
# isort: on
from edgetwin.cli.common import app, console
from edgetwin.contract.errors import GateRefused

__all__ = ["app", "describe_error", "exit_code_of", "main"]


def exit_code_of(error: BaseException) -> int:
    """The exit code of an error that ended a command: the one place the contract is decided.

    0 ok / 1 failed / 2 bad input / 3 the gate abstained. Errors say their code in ``exit_code``
    (`InputError` and `ArtifactTampered`: 2, `ArtifactRejected`: 2, `GateRefused`: 1,
    `GateAbstained`: 3); an OS error about a named file (a path that cannot be read or written) is
    bad input, 2; click's usage errors carry their own (2); anything else is a failure, 1.
    """
    code = getattr(type(error), "exit_code", None)
    if isinstance(code, int) and not isinstance(error, typer.Exit):
        return code
    if isinstance(error, typer.TyperException):  # click's usage errors: a bad flag or value
        return int(getattr(error, "exit_code", 2))
    if isinstance(error, OSError) and error.filename is not None:
        return 2
    return 1


def describe_error(error: BaseException) -> str:
    """One line for a person: a label by exit code, then the error's own words (file names first)."""
    code = exit_code_of(error)
    if isinstance(error, typer.TyperException):
        ctx = getattr(error, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        return f"error: {error.format_message()}{hint}"
    if isinstance(error, OSError) and error.filename is not None:
        return f"error: {error.filename}: {error.strerror or error}"
    label = {2: "error", 3: "abstained"}.get(code, "refused" if isinstance(error, GateRefused) else "failed")
    if code == 2 and type(error).__name__ == "ArtifactRejected":
        label = "refused"
    if code == 1 and not isinstance(error, GateRefused):
        return f"failed: {type(error).__name__}: {error} (set EDGETWIN_DEBUG=1 for the traceback)"
    return f"{label}: {error}"


class _RaisedFilter(logging.Filter):
    """Drop log records of errors that are also raised: the CLI prints those once, as the error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "raised", False)


def _install_warning_handler() -> None:
    """Warnings of edgetwin's loggers go to stderr literally, once (not through logging's last resort)."""
    log = logging.getLogger("edgetwin")
    if any(getattr(h, "_edgetwin_cli", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    handler.addFilter(_RaisedFilter())
    # a command that configures logging itself (serve) prints through the root logger instead
    handler.addFilter(lambda r: not logging.getLogger().handlers)
    handler._edgetwin_cli = True  # type: ignore[attr-defined]
    log.addHandler(handler)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app; every error is printed once, literally, one line,
    and turned into its exit code by `exit_code_of`."""
    debug = os.environ.get("EDGETWIN_DEBUG") == "1"
    _install_warning_handler()
    try:
        rv = app(args=argv, prog_name="edgetwin", standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort as e:
        # click turns an EOFError raised anywhere in a command (a truncated .gz, say) into Abort:
        # only a real interrupt is "aborted"
        cause = e.__cause__ or e.__context__
        if isinstance(cause, KeyboardInterrupt) or cause is None:
            console.print("aborted")
            sys.exit(130)
        _fail(cause, debug)
    except KeyboardInterrupt:
        console.print("aborted")
        sys.exit(130)
    except Exception as e:  # one line, not a traceback, for anything
        _fail(e, debug)
    sys.exit(rv if isinstance(rv, int) else 0)


def _fail(error: BaseException, debug: bool) -> None:
    if debug:
        traceback.print_exception(error)
    console.print(describe_error(error), markup=False, highlight=False, soft_wrap=True)
    sys.exit(exit_code_of(error))


if __name__ == "__main__":
    main()
