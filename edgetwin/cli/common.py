"""What every command group shares: the root `app`, the consoles, the common options, JSON output
and the early checks of output paths (a wrong ``--out`` is reported before any long work)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from edgetwin.contract.errors import InputError


def _flags_without_a_type() -> None:
    """Help shows no type for a flag (``--help``, ``--json``, ``--x/--no-x``): it takes no value.

    typer 0.29's help (with click 8.2+) labels every option with its Python type, ``<bool>`` for
    flags too, which reads as if ``--help`` wanted a value; no typer release leaves flags out yet,
    so `TyperOption.display_type_rich` is wrapped here, for flags only (value options keep
    ``<int>``, ``<path>``, ...); a repeatable option or a variadic argument shows its value's type
    (``<path>``, not ``<list[Path]>``; `TyperArgument` too). Idempotent; a typer without that
    method is left alone.
    """
    from typer.core import TyperArgument, TyperOption

    for cls in (TyperOption, TyperArgument):
        shown = getattr(cls, "display_type_rich", None)
        if shown is None or getattr(shown, "_edgetwin_flags", False):
            continue
        cls.display_type_rich = _without_flag_or_list_type(shown)  # type: ignore[method-assign]


def _without_flag_or_list_type(shown: Any) -> Any:
    """``shown`` (typer's `display_type_rich`) with flags untyped and ``<list[T]>`` shown as ``<t>``."""

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False) and self.metavar is None:
            return None
        result: str | None = shown(self, ctx)
        if result and result.startswith("<list[") and result.endswith("]>"):
            # one value each time the option is given (or each argument): show that value's type
            result = "<" + result[len("<list["):-2].lower() + ">"
        return result

    display_type_rich._edgetwin_flags = True  # type: ignore[attr-defined]
    return display_type_rich


_flags_without_a_type()


def legacy_fit_args(args: list[str]) -> list[str]:
    """The old spellings of the commands split out of ``fit`` (issue 46), as the new commands.

    ``fit ... --update TWIN ...`` -> ``update TWIN ...`` and ``fit ... --federated ...`` ->
    ``fit-federated ...``: ``fit`` had 27 options for three commands; the old invocations in
    scripts and docs keep working. Anything else is returned unchanged.
    """
    if not args or args[0] != "fit":
        return args
    rest = list(args[1:])
    for i, a in enumerate(rest):
        if a == "--update" and i + 1 < len(rest):
            twin = rest[i + 1]
            return ["update", twin, *rest[:i], *rest[i + 2:]]
        if a.startswith("--update="):
            return ["update", a.partition("=")[2], *rest[:i], *rest[i + 1:]]
    if "--federated" in rest:
        return ["fit-federated", *[a for a in rest if a != "--federated"]]
    return args


class _Group(TyperGroup):
    """The root group: old spellings of split commands are rewritten before parsing (`legacy_fit_args`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, legacy_fit_args(list(args)))


app = typer.Typer(
    name="edgetwin",
    cls=_Group,
    help="Learn a digital twin of an edge-cloud scheduling system from its logs, train policies "
    "offline in it, replay what-ifs and promote to the edge.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# markup off: file names and user text are printed literally ('x[bold]y.csv' stays as it is)
console = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)
out = Console(markup=False, soft_wrap=True)

SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed; the same seed gives the same result.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
TaskWorkersOpt = Annotated[
    int,
    typer.Option("--workers", min=0, help="Processes that run the independent episodes (1, the default: serially in "
                 "this process, as a worker's start-up costs ~10 s of imports; 0: one per core). The result does not "
                 "depend on it."),
]
TaskRayOpt = Annotated[
    str | None,
    typer.Option("--ray", help="Run the episodes on this Ray cluster (e.g. auto, ray://host:10001; local starts one "
                 "here); needs pip install -e \".[ray]\". The result does not depend on it."),
]

AllowCodeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-code",
        help="Allow this module (and its submodules) to run for the spec's function references "
        "([[dynamics]] / [reward] / [transition] function); repeatable. Without it (or "
        "EDGETWIN_ALLOW_CODE / the allow-list file, docs/log-format.md) a spec's module is never imported.",
    ),
]
RegistryOpt = Annotated[
    str,
    typer.Option(
        "--registry",
        envvar="EDGETWIN_REGISTRY",
        help="Registry: a directory (created on publish) or a nats://host:port URL (JetStream).",
    ),
]
BucketOpt = Annotated[str, typer.Option("--bucket", help="NATS bucket prefix of the registry.")]


def emit_json(obj: Any) -> None:
    """Print a JSON document on stdout (numbers that numpy made are converted)."""
    print(json.dumps(obj, indent=2, default=json_default))


def json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def out_dir_arg(path: Path, flag: str = "--out") -> Path:
    """Check (and create) an output directory before any long work: exit 2 with one line if it is
    an existing file or cannot be created or written, instead of a raw exception at the end."""
    if path.exists() and not path.is_dir():
        raise InputError("exists and is not a directory", f"{flag} {path}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the directory ({e.strerror or e})", f"{flag} {path}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError("the directory is not writable", f"{flag} {path}")
    return path


def out_file_arg(path: Path, flag: str = "--out") -> Path:
    """Check an output file's place before any long work (exit 2 if it is a directory or unwritable)."""
    if path.is_dir():
        raise InputError("is a directory; expected a file name", f"{flag} {path}")
    out_dir_arg(path.parent if str(path.parent) else Path("."), flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError("the file exists and is not writable", f"{flag} {path}")
    return path



def rounds_option(rounds: int | None) -> dict[str, Any]:
    """``--fed-rounds`` as `FitOptions` keywords: none when not given (its default schedule)."""
    return {} if rounds is None else {"rounds": rounds}
