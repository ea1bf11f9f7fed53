"""`edgetwin ... --help` shows no type for a flag (typer 0.29 labelled ``--help`` itself ``<bool>``)."""

from __future__ import annotations

import click
import typer.main
from typer.testing import CliRunner

from edgetwin.cli import app


def _paths(cmd: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, sub in (getattr(cmd, "commands", None) or {}).items():  # a group (typer's is no click.Group)
        out += _paths(sub, (*path, name))
    return out


def test_no_flag_is_shown_with_a_type_in_any_commands_help() -> None:
    root = typer.main.get_command(app)
    paths = _paths(root)
    assert len(paths) > 15  # every command and group, the root too
    runner = CliRunner()
    typed = 0
    for path in paths:
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0, (path, res.output)
        assert "<bool>" not in res.output and "<list[" not in res.output, path
        assert "--help" in res.output, path
        typed += "<int" in res.output or "<path>" in res.output
    assert typed > 5  # options that take a value still show its type
