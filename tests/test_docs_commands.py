"""Every `edgetwin ...` line in the README's and docs' code blocks names a command that exists, with flags it takes.

A documented command that the CLI does not have (a renamed subcommand, a dropped or misspelt flag) is a
claim the code does not keep; this reads the fenced code blocks of README.md and docs/*.md and checks
each line against the CLI's own click tree (the old spellings the root group rewrites are not used).
"""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import click
import pytest
import typer.main

from edgetwin.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of each command inside a ``` fence that starts with ``edgetwin ``, its
    backslash-continued lines joined to it (a flag on a continuation line is the command's too)."""
    out, fenced, lines = [], False, path.read_text().splitlines()
    no = 0
    while no < len(lines):
        line, no = lines[no], no + 1
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        text = line.strip()
        if text.startswith("$ "):
            text = text[2:]
        if fenced and text.startswith("edgetwin "):
            start = no
            while re.sub(r"\s#\s.*$", "", text).rstrip().endswith("\\") and no < len(lines):
                text = re.sub(r"\s#\s.*$", "", text).rstrip()[:-1] + " " + lines[no].strip()
                no += 1
            out.append((start, text))
    return out


def _words(text: str) -> list[str]:
    text = re.sub(r"\s#\s.*$", "", text)  # a trailing comment
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in a placeholder
        return text.split()


def _resolve(root: click.Command, words: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """The command the words name, the path walked, and the words after it."""
    cmd, path, rest = root, [], words[1:]
    while rest and getattr(cmd, "commands", None) and rest[0] in cmd.commands:  # type: ignore[attr-defined]
        cmd = cmd.commands[rest[0]]  # type: ignore[attr-defined]
        path.append(rest[0])
        rest = rest[1:]
    return cmd, path, rest


@functools.cache
def cli_tree() -> click.Command:
    """The CLI's click tree (`typer.main.get_command`), built once per test process: every documented
    line is read against the same tree, which no check changes (~0.12 CPU s a build, ~120 lines here and
    in tests/test_claims_inline_commands.py)."""
    return typer.main.get_command(app)


def _documented() -> list[tuple[str, int, str]]:
    return [(p.relative_to(ROOT).as_posix(), no, text) for p in DOCS for no, text in _code_lines(p)]


def test_the_docs_show_commands() -> None:
    assert len(_documented()) > 40  # README and docs hold dozens of command lines; the reader found them


@pytest.mark.parametrize(("doc", "line", "text"), _documented(), ids=lambda v: str(v)[:40])
def test_documented_command_exists_with_its_flags(doc: str, line: int, text: str) -> None:
    cmd, path, rest = _resolve(cli_tree(), _words(text))
    assert path, f"{doc}:{line}: no such command: {text}"
    assert not getattr(cmd, "commands", None), f"{doc}:{line}: `{' '.join(path)}` is a group, not a command: {text}"
    known = {opt for param in cmd.params for opt in (*param.opts, *param.secondary_opts)}
    for word in rest:
        flag = word.strip("[]()|,").split("=", 1)[0]
        if re.fullmatch(r"--[a-z][a-z0-9-]*", flag):
            assert flag in known, f"{doc}:{line}: `edgetwin {' '.join(path)}` has no {flag}: {text}"
