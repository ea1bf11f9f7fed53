"""Writing a benchmark's result into docs/benchmarks.md: one section per script, replaced in place."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def write_section(heading: str, text: str, doc: Path = DOC, keep: Sequence[str] = ()) -> None:
    """Replace the ``heading`` section (up to the next ``## ``) with ``text``, or append it; one write.

    Args:
        heading: the section's heading line, e.g. ``"## Emulated cluster throughput"``.
        text: the whole section, starting with that heading.
        doc: the Markdown file (default docs/benchmarks.md).
        keep: starts of ``### `` headings of hand-written subsections (analyses, extra runs) that a
            rerun keeps: each found in the current section is appended, up to the next ``### ``.
    """
    current = doc.read_text() if doc.is_file() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    section = pattern.search(current)
    kept = []
    for head in keep:
        m = re.search(rf"^{re.escape(head)}.*?(?=^### |\Z)", section.group(0), re.S | re.M) if section else None
        if m:
            kept.append(m.group(0).rstrip())
    block = "\n\n".join([text.rstrip(), *kept]) + "\n\n"
    new = pattern.sub(lambda _: block, current) if section else current.rstrip() + "\n\n" + block
    doc.write_text(new)
