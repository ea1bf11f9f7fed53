"""The ``edgetwin`` command.

Every command has ``--help`` and ``--seed`` where it samples; ``--json`` where a script reads the
result. Exit codes: 0 ok, 1 failed (a gate refused, a check did not pass, an unexpected error),
2 bad input (a file, row, column or flag we cannot use). Errors are one line, not a traceback;
set ``EDGETWIN_DEBUG=1`` to see the traceback.

Commands live here, grouped by the part of the pipeline they drive; the work itself is in the
subpackages, so each command is only argument handling and printing.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from edgetwin.errors import GateRefused, InputError

app = typer.Typer(
    name="edgetwin",
    help="Learn a digital twin of an edge-cloud scheduling system from its logs, train policies "
    "offline in it, replay what-ifs and promote to the edge.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
logs_app = typer.Typer(help="Generate, validate and inspect logs.", no_args_is_help=True)
app.add_typer(logs_app, name="logs")

console = Console(stderr=True)
out = Console()

SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed; the same seed gives the same result.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]


def emit_json(obj: Any) -> None:
    """Print a JSON document on stdout (numbers that numpy made are converted)."""
    print(json.dumps(obj, indent=2, default=_json_default))


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# ------------------------------------------------------------------------------------- logs
@logs_app.command("validate")
def logs_validate(
    log: Annotated[Path, typer.Argument(help="Log table (.parquet or .csv).")],
    spec: Annotated[Path | None, typer.Option(help="Twin spec (TOML); default LOG.spec.toml beside the log.")] = None,
    quarantine: Annotated[
        Path | None, typer.Option(help="Where unusable rows go; default LOG.quarantine.csv beside the log.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Report every problem of a log at once; exit 0 if it is usable, 2 if it is not."""
    from edgetwin.twin.validate import validate_log

    report = validate_log(log, spec=spec, quarantine_path=quarantine)
    if as_json:
        emit_json(report.to_dict())
    else:
        out.print(report.summary())
    raise typer.Exit(0 if report.usable else 2)


# ------------------------------------------------------------------------------------- entry
def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app and map errors to exit codes 1 / 2."""
    debug = os.environ.get("EDGETWIN_DEBUG") == "1"
    try:
        rv = app(args=argv, prog_name="edgetwin", standalone_mode=False)
    except typer.Abort:
        console.print("aborted")
        sys.exit(130)
    except typer.TyperException as e:  # typer's (vendored click's) usage errors: a bad flag
        show = getattr(e, "show", None)
        if callable(show):
            show()
        else:
            console.print(f"[bold red]error:[/] {e}", highlight=False)
        sys.exit(getattr(e, "exit_code", 2))
    except InputError as e:
        if debug:
            traceback.print_exc()
        console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except GateRefused as e:
        console.print(f"[bold red]refused:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # one line, not a traceback, for anything unexpected
        if debug:
            traceback.print_exc()
        console.print(
            f"[bold red]failed:[/] {type(e).__name__}: {e} (set EDGETWIN_DEBUG=1 for the traceback)",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
