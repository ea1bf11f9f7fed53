"""Every module, function and file the README and docs name in backticks exists.

A sentence such as "the verdict is `edgetwin.loop.day_verdict.stopped_verdict`" or "see
`edgetwin/twin/intervals.py`" is a claim that the named thing is there; a rename that leaves the page
behind breaks it. Names under ``edgetwin.`` that are not a module of the package (bus subjects such
as ``edgetwin.canary.log.<site>``, the logger ``edgetwin.bus``) are not Python names and are skipped.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import edgetwin

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = {m.name for m in pkgutil.iter_modules(edgetwin.__path__)}


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute chain on the longest module prefix of it."""
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _named() -> list[tuple[str, str]]:
    """(where, name) of every ``edgetwin.<module>...`` name and repository path in a backtick span."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"`([^`\n]+)`", text):
            where = f"{doc.relative_to(ROOT).as_posix()}:{text[: m.start()].count(chr(10)) + 1}"
            for name in re.findall(r"(?<![\w/.])edgetwin(?:\.[A-Za-z_]\w*)+", m.group(1)):
                if name.split(".")[1] in TOP:
                    out.append((where, name))
            for path in re.findall(r"(?<![\w/.])((?:edgetwin|tests|benchmarks)/[\w/.\-]*\w)", m.group(1)):
                out.append((where, path))
    return out


def test_the_docs_name_modules_and_files() -> None:
    named = _named()
    assert sum("/" not in n for _, n in named) > 40 and sum("/" in n for _, n in named) > 20


@pytest.mark.parametrize(("where", "name"), _named(), ids=lambda v: str(v)[-50:])
def test_a_named_module_function_or_file_exists(where: str, name: str) -> None:
    if "/" in name:
        assert (ROOT / name).exists(), f"{where}: no file {name}"
    else:
        assert _resolves(name), f"{where}: {name} does not resolve"


def _links() -> list[tuple[str, str]]:
    """(where, target) of every relative Markdown link of the README and docs/*.md inside the repository
    (``../shared`` beside a clone is not the repository's to keep)."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target) or not (doc.parent / target).resolve().is_relative_to(ROOT):
                continue
            out.append((f"{doc.relative_to(ROOT).as_posix()}:{text[: m.start()].count(chr(10)) + 1}", target))
    return out


def test_every_link_of_the_readme_and_docs_resolves() -> None:
    links = _links()
    assert len(links) > 30
    where_from = {w.split(":")[0] for w, _ in links}
    missing = [(w, t) for w, t in links if not (ROOT / w.split(":")[0]).parent.joinpath(t).exists()]
    assert not missing, missing
    assert "README.md" in where_from and "docs/canary.md" in where_from
