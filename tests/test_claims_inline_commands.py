"""Every `edgetwin ...` written inline in the README's and docs' prose names a command with its flags.

`test_docs_commands.py` checks the fenced code blocks; a sentence's inline command is as much a claim
(docs/canary.md once said `edgetwin promote --canary`, a flag `promote` does not have: it is
`--canary-config FILE`). This reads every backtick span outside the fences that starts with
``edgetwin `` and checks it against the CLI's own click tree, with the same reader.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_docs_commands import _resolve, _words, cli_tree

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _inline() -> list[tuple[str, str]]:
    """(file:line, command) of each inline ``edgetwin ...`` span; fenced blocks are blanked first
    (line numbers kept) so that their backticks do not pair with the prose's."""
    out = []
    for doc in DOCS:
        text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), doc.read_text(), flags=re.S)
        for m in re.finditer(r"`(edgetwin [^`]+)`", text):
            where = f"{doc.relative_to(ROOT).as_posix()}:{text[: m.start()].count(chr(10)) + 1}"
            out.append((where, " ".join(m.group(1).split())))
    return out


def test_the_prose_names_commands() -> None:
    assert len(_inline()) > 40


@pytest.mark.parametrize(("where", "text"), _inline(), ids=lambda v: str(v)[:40])
def test_an_inline_command_exists_with_its_flags(where: str, text: str) -> None:
    cmd, path, rest = _resolve(cli_tree(), _words(text))
    assert path, f"{where}: no such command: {text}"
    known = {opt for param in cmd.params for opt in (*param.opts, *param.secondary_opts)}
    for word in rest:
        flag = word.strip("[]()|,").split("=", 1)[0]
        if re.fullmatch(r"--[a-z][a-z0-9-]*", flag):
            assert flag in known, f"{where}: `edgetwin {' '.join(path)}` has no {flag}: {text}"
